//! The NVFP4 KV / index cache (ARCHITECTURE.md, *NVFP4 KV cache*): blocks
//! whose codes, scales and reads are worked out by hand from the
//! definition (FORMATS.md's E2M1 tie table, E4M3 values), the all-zero and
//! underflowing blocks, a saturated block scale, NaN / Inf blocks, the
//! cache tensor's layout (slots, head slices, page copies) and its byte
//! accounting. The independent numpy reference checks the same codec on
//! many more rows (`cpu-ref/tests/nvfp4_cache.rs`).

use m3_core::formats::convert::{cache_load_nvfp4, cache_store_nvfp4};
use m3_core::kv::{CacheData, CacheDtype, CacheTensor, KvError};

/// Store one 16-value block with global `g`; return (packed codes, scale
/// byte, reads).
fn block(x: [f32; 16], g: f32) -> ([u8; 8], u8, [f32; 16]) {
    let mut codes = [0u8; 8];
    let mut scale = [0u8; 1];
    cache_store_nvfp4(&x, g, &mut codes, &mut scale).unwrap();
    let mut y = [0f32; 16];
    cache_load_nvfp4(&codes, &scale, g, 0, &mut y);
    (codes, scale[0], y)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn e2m1_ties_at_unit_block_scale() {
    // bamax 6 and g = 1: s = e4m3(6 / 6) = 1.0 = 0 0111 000 = 0x38, so the
    // codes are FORMATS.md's E2M1 rounding of the values themselves:
    // 0.75 -> 1, 0.25 -> 0, 5 -> 4, 2.5 -> 2, 3.5 -> 4, 1.25 -> 1,
    // 1.75 -> 2 (ties to the even code), 0.2 -> 0, -0 keeps its sign.
    let x = [
        6.0, 3.0, -1.5, 0.75, 0.25, 0.2, -0.0, 5.0, 2.5, 3.5, 1.25, 1.75, -6.0, 0.0, 0.5, 4.0,
    ];
    let (codes, s, y) = block(x, 1.0);
    assert_eq!(s, 0x38);
    // codes 7 5 B 2 0 0 8 6 4 6 2 4 F 0 1 6, low nibble = even element
    assert_eq!(codes, [0x57, 0x2B, 0x00, 0x68, 0x64, 0x42, 0x0F, 0x61]);
    let want = [
        6.0, 3.0, -1.5, 1.0, 0.0, 0.0, -0.0, 4.0, 2.0, 4.0, 1.0, 2.0, -6.0, 0.0, 0.5, 4.0,
    ];
    assert!(same_bits(&y, &want), "{y:?}");

    // The per-tensor scale is the global: the same block times 3 with g = 3
    // gives the same codes and scale, and reads 3x the values (exact).
    let x3 = x.map(|v| 3.0 * v);
    let (c3, s3, y3) = block(x3, 3.0);
    assert_eq!((c3, s3), (codes, s));
    assert!(same_bits(&y3, &want.map(|v| 3.0 * v)), "{y3:?}");
}

#[test]
fn block_scale_below_one_and_rounding_down() {
    // bamax 0.75: s = e4m3(0.125) = 2^-3 = 0 0100 000 = 0x20;
    // 0.75 / 0.125 = 6 (code 7), 0.3 / 0.125 = 2.4 -> 2 (code 4),
    // -0.1875 / 0.125 = -1.5 (code B).
    let mut x = [0f32; 16];
    x[..3].copy_from_slice(&[0.75, 0.3, -0.1875]);
    let (codes, s, y) = block(x, 1.0);
    assert_eq!(s, 0x20);
    assert_eq!(codes[0], 0x47);
    assert_eq!(codes[1], 0x0B);
    assert_eq!(&y[..3], &[0.75, 0.25, -0.1875]);

    // bamax 6.375: 6.375 / 6 = 1.0625, the E4M3 midpoint of 1.0 and 1.125,
    // ties to 1.0 (even mantissa); 6.375 / 1.0 then saturates to 6.
    let mut x = [0f32; 16];
    x[0] = 6.375;
    x[1] = -3.1875; // -3.1875 -> -3
    let (codes, s, y) = block(x, 1.0);
    assert_eq!(s, 0x38);
    assert_eq!(codes[0], 0xD7);
    assert_eq!(&y[..2], &[6.0, -3.0]);
}

#[test]
fn all_zero_and_underflowing_blocks_read_zero() {
    let (codes, s, y) = block([0.0; 16], 1.0);
    assert_eq!((codes, s), ([0; 8], 0));
    assert!(y.iter().all(|&v| v.to_bits() == 0));

    // -0.0 alone: bamax 0, s = 0, codes 0: the block reads +0 (the sign of
    // a zero block is not kept).
    let (_, s, y) = block([-0.0; 16], 1.0);
    assert_eq!(s, 0);
    assert!(y.iter().all(|&v| v.to_bits() == 0));

    // bamax / 6 = 2^-10 exactly: the midpoint of 0 and the least E4M3
    // subnormal 2^-9 ties to 0 (even), so every code is 0.
    let mut x = [0f32; 16];
    x[3] = 6.0 * 2f32.powi(-10);
    x[4] = -2f32.powi(-12);
    let (codes, s, y) = block(x, 1.0);
    assert_eq!((codes, s), ([0; 8], 0));
    assert!(y.iter().all(|&v| v.to_bits() == 0));

    // bamax 2^-7: 2^-7 / 6 = 1.30e-3 rounds to s = 2^-9 (code 0x01);
    // 2^-7 / 2^-9 = 4 (code 6) reads 4 * 2^-9 = 2^-7 again.
    let mut x = [0f32; 16];
    x[0] = 2f32.powi(-7);
    let (codes, s, y) = block(x, 1.0);
    assert_eq!((codes[0], s), (0x06, 0x01));
    assert_eq!(y[0], 2f32.powi(-7));
}

#[test]
fn saturated_block_scale_clips_values_to_2688_g() {
    // bamax / 6 = 500 > 448: s saturates to 448 (0x7E); values then divide
    // by 448: 3000 -> 6.70 -> 6, 100 -> 0.223 -> 0, -2688 -> -6,
    // 1000 -> 2.23 -> 2, 448 -> 1, -1e5 -> -6 (saturated).
    let mut x = [0f32; 16];
    x[..6].copy_from_slice(&[3000.0, 100.0, -2688.0, 1000.0, 448.0, -1e5]);
    let (codes, s, y) = block(x, 1.0);
    assert_eq!(s, 0x7E);
    assert_eq!(&codes[..3], &[0x07, 0x4F, 0xF2]);
    assert_eq!(&y[..6], &[2688.0, 0.0, -2688.0, 896.0, 448.0, -2688.0]);
    // with g = 0.5 the same block saturates at 2688 * 0.5
    let (_, s, y) = block(x, 0.5);
    assert_eq!(s, 0x7E);
    assert_eq!(y[0], 1344.0);
}

#[test]
fn nan_and_inf_blocks_read_nan_and_leave_other_blocks_alone() {
    let mut row = [0.5f32; 32];
    row[5] = f32::NAN;
    let mut codes = [0u8; 16];
    let mut scales = [0u8; 2];
    cache_store_nvfp4(&row, 1.0, &mut codes, &mut scales).unwrap();
    // block 0: scale byte 0x7F (E4M3 NaN), codes 0; block 1: 0.5 with
    // s = e4m3(0.5 / 6) = e4m3(1.333 * 2^-4) = 1.375 * 2^-4 = 0.0859375
    // (0 0011 011 = 0x1B), 0.5 / 0.0859375 = 5.82 -> 6 (code 7): reads
    // 0.515625.
    assert_eq!(scales, [0x7F, 0x1B]);
    assert!(codes[..8].iter().all(|&c| c == 0));
    assert!(codes[8..].iter().all(|&c| c == 0x77));
    let mut y = [0f32; 32];
    cache_load_nvfp4(&codes, &scales, 1.0, 0, &mut y);
    assert!(y[..16].iter().all(|v| v.is_nan()));
    assert!(y[16..].iter().all(|&v| v == 0.515625));

    for bad in [f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = [1.0f32; 16];
        x[15] = bad;
        let (codes, s, y) = block(x, 1.0);
        assert_eq!((codes, s), ([0; 8], 0x7F), "{bad}");
        assert!(y.iter().all(|v| v.is_nan()), "{bad}");
    }
}

#[test]
fn rows_that_are_not_whole_blocks_are_refused() {
    let mut codes = [0u8; 12];
    let mut scales = [0u8; 1];
    assert!(cache_store_nvfp4(&[1.0; 24], 1.0, &mut codes, &mut scales).is_err());
    let mut codes = [0u8; 8];
    assert!(cache_store_nvfp4(&[1.0; 16], 1.0, &mut codes[..7], &mut scales).is_err());
}

#[test]
fn cache_tensor_layout_reads_head_slices_and_copies_pages() {
    // two heads of 16 (one block each) in a row of 32, three slots
    let mut t = CacheTensor::new(CacheDtype::Nvfp4, 3, 32, 2.0).unwrap();
    assert_eq!(t.slots(), 3);
    let mut row = [0f32; 32];
    for (i, v) in row.iter_mut().enumerate() {
        *v = 2.0 * (i as f32 - 16.0) / 4.0; // -8 .. 7.5, all multiples of 0.5
    }
    t.write(1, &row).unwrap();
    let mut whole = [0f32; 32];
    t.read(1, 0, &mut whole);
    let mut head1 = [0f32; 16];
    t.read(1, 16, &mut head1);
    assert!(same_bits(&head1, &whole[16..]));
    // a range across the block boundary reads the same values
    let mut mid = [0f32; 12];
    t.read(1, 10, &mut mid);
    assert!(same_bits(&mid, &whole[10..22]));
    // block 0: bamax 8, g 2: s = e4m3(8 / 12) = 0.6875 (0x33); -8 / 1.375
    // = -5.82 -> -6: reads -8.25. block 1: bamax 7.5: s = e4m3(0.625) =
    // 0.625 (0x32); 7.5 / 1.25 = 6: reads 7.5.
    let CacheData::Nvfp4 { codes, scales } = &t.data else {
        panic!("not an nvfp4 tensor")
    };
    assert_eq!(&scales[2..4], &[0x33, 0x32]);
    assert_eq!(codes[16] & 0x0F, 0x0F);
    assert_eq!((whole[0], whole[31]), (-8.25, 7.5));
    // slot 0 untouched, still zero
    let mut z = [1f32; 32];
    t.read(0, 0, &mut z);
    assert!(z.iter().all(|&v| v.to_bits() == 0));
    // page copy: slot 1 -> slot 2, raw
    t.copy_slots(1, 2, 1).unwrap();
    let mut c = [0f32; 32];
    t.read(2, 0, &mut c);
    assert!(same_bits(&c, &whole));
    assert!(t.copy_slots(2, 1, 2).is_err(), "past the last slot");
    t.resize_slots(5);
    assert_eq!(t.slots(), 5);
}

#[test]
fn cache_tensor_refuses_bad_rows_scales_and_slots() {
    // control: a whole number of blocks and a positive scale is accepted
    assert!(CacheTensor::new(CacheDtype::Nvfp4, 2, 48, 1.0).is_ok());
    match CacheTensor::new(CacheDtype::Nvfp4, 2, 40, 1.0) {
        Err(KvError::RowWidth { width, block, .. }) => assert_eq!((width, block), (40, 16)),
        other => panic!("{other:?}"),
    }
    // bf16 and fp8 rows have no block
    assert!(CacheTensor::new(CacheDtype::Bf16, 2, 40, 1.0).is_ok());
    for s in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            CacheTensor::new(CacheDtype::Nvfp4, 2, 32, s),
            Err(KvError::Scale { .. })
        ));
    }
    let mut t = CacheTensor::new(CacheDtype::Nvfp4, 2, 32, 1.0).unwrap();
    assert!(t.write(2, &[0.0; 32]).is_err(), "slot past the end");
    assert!(t.write(0, &[0.0; 16]).is_err(), "short row");
    assert!(t.write(1, &[0.0; 32]).is_ok());
}

#[test]
fn row_bytes_and_parse() {
    // nvfp4: half a byte a value + one scale byte per 16 values
    assert_eq!(CacheDtype::Nvfp4.row_bytes(64), 32 + 4);
    assert_eq!(CacheDtype::Fp8E4M3.row_bytes(64), 64);
    assert_eq!(CacheDtype::Bf16.row_bytes(64), 128);
    assert_eq!(CacheDtype::parse("nvfp4"), Some(CacheDtype::Nvfp4));
    assert_eq!(CacheDtype::Nvfp4.name(), "nvfp4");
}
