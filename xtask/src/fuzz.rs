//! `cargo xtask fuzz [--seconds N] [--require]`: fuzz the safetensors
//! header validator and the shard-index parser.
//!
//! With `cargo fuzz` and a nightly toolchain installed it runs the
//! libFuzzer target in `fuzz/` for N seconds. Otherwise it says so and
//! (unless `--require`) runs the same entry point
//! (`m3_core::checkpoint::safetensors_file::fuzz_one`) in-process over a
//! corpus of mutated inputs from a fixed-seed PRNG, so it is useful on
//! stable too. Either way it is short enough for CI (default 10 s).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::venv::workspace_root;

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// How long to fuzz, in seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Fail instead of falling back when cargo-fuzz or nightly is missing.
    #[arg(long)]
    pub require: bool,
    /// PRNG seed of the in-process fallback.
    #[arg(long, default_value_t = 0x6d33_6675_7a7a)]
    pub seed: u64,
}

const TARGET: &str = "safetensors_header";

pub fn fuzz(args: FuzzArgs) -> Result<()> {
    let root = workspace_root();
    let fuzz_dir = root.join("fuzz");
    match libfuzzer_available(&fuzz_dir) {
        Ok(()) => {
            let corpus = fuzz_dir.join("corpus").join(TARGET);
            std::fs::create_dir_all(&corpus).context("creating the fuzz corpus dir")?;
            for (i, s) in seeds(&root).iter().enumerate() {
                let p = corpus.join(format!("seed-{i}"));
                if !p.exists() {
                    std::fs::write(&p, s).with_context(|| format!("writing {}", p.display()))?;
                }
            }
            eprintln!(
                "xtask fuzz: cargo +nightly fuzz run {TARGET} for {} s",
                args.seconds
            );
            let status = Command::new("cargo")
                .current_dir(&fuzz_dir)
                .args(["+nightly", "fuzz", "run", TARGET])
                .arg(&corpus)
                .arg("--")
                .arg(format!("-max_total_time={}", args.seconds))
                .status()
                .context("running cargo fuzz")?;
            if !status.success() {
                bail!("cargo fuzz found a failure (see fuzz/artifacts/{TARGET})");
            }
            Ok(())
        }
        Err(why) => {
            if args.require {
                bail!("libFuzzer run required but unavailable: {why}");
            }
            eprintln!(
                "xtask fuzz: {why}; running the in-process fallback (stable) for {} s",
                args.seconds
            );
            in_process(&root, Duration::from_secs(args.seconds), args.seed)
        }
    }
}

/// Ok when `cargo +nightly fuzz` can run; else the reason.
fn libfuzzer_available(fuzz_dir: &Path) -> std::result::Result<(), String> {
    if !fuzz_dir.join("Cargo.toml").exists() {
        return Err(format!("{} has no Cargo.toml", fuzz_dir.display()));
    }
    let ok = |args: &[&str]| {
        Command::new("cargo")
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !ok(&["+nightly", "--version"]) {
        return Err("no nightly toolchain (rustup toolchain install nightly)".into());
    }
    if !ok(&["+nightly", "fuzz", "--version"]) {
        return Err("cargo-fuzz is not installed (cargo install cargo-fuzz)".into());
    }
    Ok(())
}

/// xorshift64*: a fixed-seed PRNG, so a failing run can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// A well-formed safetensors file from (name, dtype, shape) entries.
fn st_file(entries: &[(&str, &str, &[usize], usize)]) -> Vec<u8> {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut off = 0;
    for (name, dtype, shape, esize) in entries {
        let n: usize = shape.iter().product::<usize>() * esize;
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            ",\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            dims.join(","),
            off + n
        ));
        off += n;
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend((0..off).map(|i| i as u8));
    out
}

/// Valid starting points: small hand-made files, an index, and the
/// Python-written fixture's index and shard headers when present.
fn seeds(root: &Path) -> Vec<Vec<u8>> {
    let mut s = vec![
        st_file(&[("a.weight", "BF16", &[4, 8], 2), ("a.weight_scale", "U8", &[4, 1], 1)]),
        st_file(&[("x", "F8_E4M3", &[2, 32], 1), ("x_s", "U8", &[2, 1], 1), ("g", "F32", &[], 4)]),
        st_file(&[]),
        br#"{"metadata":{"total_size":96},"weight_map":{"a.weight":"model-00001-of-00002.safetensors","b":"sub/x.safetensors"}}"#
            .to_vec(),
    ];
    let fx = root.join("tests/fixtures/py_ckpt");
    if let Ok(b) = std::fs::read(fx.join("model.safetensors.index.json")) {
        s.push(b);
    }
    if let Ok(b) = std::fs::read(fx.join("model-00002-of-00002.safetensors")) {
        s.push(b);
    }
    s
}

const INTERESTING: &[&[u8]] = &[
    b"0",
    b"-1",
    b"18446744073709551615",
    b"4294967296",
    b"[",
    b"]",
    b"{",
    b"}",
    b"\"",
    b",",
    b":",
    b"null",
    b"\"BF16\"",
    b"\"F8_E4M3\"",
    b"\"U8\"",
    b"..",
    b"/",
    b"\\u0000",
    b"1e309",
    b"[0,0]",
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 if len > 0 => input.truncate(rng.below(len)),
            3 => {
                let tok = INTERESTING[rng.below(INTERESTING.len())];
                let i = rng.below(len + 1);
                input.splice(i..i, tok.iter().copied());
            }
            4 if len > 1 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(16)).min(len);
                input.drain(a..b);
            }
            5 if len >= 8 => {
                // Rewrite the header length: near the true value or wild.
                let cur = u64::from_le_bytes(input[..8].try_into().unwrap_or([0; 8]));
                let v = match rng.below(3) {
                    0 => cur.wrapping_add(rng.below(17) as u64).wrapping_sub(8),
                    1 => rng.next(),
                    _ => len as u64,
                };
                input[..8].copy_from_slice(&v.to_le_bytes());
            }
            6 => {
                // Change a number in the JSON text.
                let digits: Vec<usize> = (0..len).filter(|&i| input[i].is_ascii_digit()).collect();
                if !digits.is_empty() {
                    let i = digits[rng.below(digits.len())];
                    input[i] = b'0' + rng.below(10) as u8;
                }
            }
            7 => {
                // Splice a piece of another seed.
                let other = &pool[rng.below(pool.len())];
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = (a + 1 + rng.below(64)).min(other.len());
                    let i = rng.below(len + 1);
                    input.splice(i..i, other[a..b].iter().copied());
                }
            }
            _ => {
                let i = rng.below(len + 1);
                input.insert(i, rng.next() as u8);
            }
        }
    }
}

fn in_process(root: &Path, budget: Duration, seed: u64) -> Result<()> {
    let pool = seeds(root);
    // Every seed must be accepted by one of the parsers, or the fuzzing
    // starts from noise and never reaches the deep checks.
    for (i, s) in pool.iter().enumerate() {
        let ok = m3_core::checkpoint::safetensors_file::parse_header("seed", s).is_ok()
            || m3_core::checkpoint::index::parse_index("seed", s).is_ok();
        if !ok {
            bail!("fuzz seed {i} is rejected by both parsers");
        }
    }
    let mut rng = Rng(seed | 1);
    let start = Instant::now();
    let (mut iters, mut accepted) = (0u64, 0u64);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut failure = None;
    while start.elapsed() < budget {
        for _ in 0..256 {
            let mut input = pool[rng.below(pool.len())].clone();
            mutate(&mut rng, &mut input, &pool);
            let r = std::panic::catch_unwind(|| {
                m3_core::checkpoint::safetensors_file::fuzz_one(&input);
                m3_core::checkpoint::safetensors_file::parse_header("x", &input).is_ok()
            });
            iters += 1;
            match r {
                Ok(true) => accepted += 1,
                Ok(false) => {}
                Err(e) => {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    failure = Some((input, msg));
                    break;
                }
            }
        }
        if failure.is_some() {
            break;
        }
    }
    std::panic::set_hook(hook);
    if let Some((input, msg)) = failure {
        let dir = root.join("target").join("fuzz-fallback");
        std::fs::create_dir_all(&dir)?;
        let p = dir.join(format!("crash-{iters}.bin"));
        let tmp = p.with_extension("bin.tmp");
        std::fs::write(&tmp, &input)?;
        std::fs::rename(&tmp, &p)?;
        bail!(
            "fuzz_one panicked after {iters} inputs ({msg}); input saved to {}",
            p.display()
        );
    }
    println!(
        "xtask fuzz (in-process): {iters} inputs in {:.1} s, {accepted} valid headers, no panics",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
