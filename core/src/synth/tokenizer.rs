//! A deterministic byte-level BPE `tokenizer.json` for a synthetic vocabulary.
//!
//! Layout of the `V` ids: 0..256 are the 256 bytes (id = byte value, spelled
//! with the GPT-2 byte-to-unicode map), then `V - 258` merges, then two
//! special tokens: `<|endoftext|>` (id `V - 2`) and `<|mask|>` (id `V - 1`,
//! the DSpark mask token). Every id decodes (the byte-level decoder turns
//! any byte sequence into text, invalid UTF-8 replaced), so any generated
//! id stream prints.
//!
//! Merges are built level by level over a small alphabet (space-prefixed
//! and plain lowercase words): level 2 joins a start symbol and a letter,
//! level n+1 extends each level-n token by a letter, so each merge's parts
//! exist before it, and the ranks are in creation order.

use std::collections::BTreeMap;
use std::string::String;
use std::vec::Vec;

use serde_json::{json, Value};

/// End-of-text special token.
pub const EOS: &str = "<|endoftext|>";
/// DSpark mask special token.
pub const MASK: &str = "<|mask|>";

/// Id of `<|endoftext|>` in a vocabulary of `vocab` ids.
pub fn eos_token_id(vocab: usize) -> u32 {
    (vocab - 2) as u32
}
/// Id of `<|mask|>` in a vocabulary of `vocab` ids.
pub fn mask_token_id(vocab: usize) -> u32 {
    (vocab - 1) as u32
}

/// GPT-2's byte-to-unicode map: printable Latin-1 bytes map to themselves,
/// the others to U+0100 onwards in byte order.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// The `tokenizer.json` text for a vocabulary of `vocab` ids (at least 258).
pub fn tokenizer_json(vocab: usize) -> Result<String, String> {
    if vocab < 258 {
        return Err(format!(
            "tokenizer: vocab_size {vocab} is below 258 (256 bytes + 2 special tokens)"
        ));
    }
    let n_merges = vocab - 258;
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut merges: Vec<Value> = Vec::with_capacity(n_merges);
    let letters: Vec<String> = (b'a'..=b'z').map(|b| (b as char).to_string()).collect();
    // Level-1 starts: a space-prefixed start symbol, then the letters.
    let mut level: Vec<String> = core::iter::once(byte_char(b' ').to_string())
        .chain(letters.iter().cloned())
        .collect();
    'outer: while merges.len() < n_merges {
        let mut next = Vec::with_capacity(level.len() * letters.len());
        for t in &level {
            for c in &letters {
                if merges.len() == n_merges {
                    break 'outer;
                }
                merges.push(Value::from(format!("{t} {c}")));
                let joined = format!("{t}{c}");
                tokens.push(joined.clone());
                next.push(joined);
            }
        }
        level = next;
    }
    let vocab_map: BTreeMap<String, usize> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i))
        .collect();
    if vocab_map.len() != vocab - 2 {
        return Err(format!(
            "tokenizer: {} distinct tokens for {} ids",
            vocab_map.len(),
            vocab - 2
        ));
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let t = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(eos_token_id(vocab), EOS), special(mask_token_id(vocab), MASK)],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab_map,
            "merges": merges,
        },
    });
    serde_json::to_string(&t).map_err(|e| format!("tokenizer: {e}"))
}

/// `generation_config.json`: the end-of-text id and sampling defaults in
/// the shape MiniMax ships (temperature 1.0, top_p 0.95, top_k 40), which
/// a server applies to requests that leave those fields out.
pub fn generation_config_json(vocab: usize) -> Result<String, String> {
    if vocab < 258 {
        return Err(format!(
            "generation_config: vocab_size {vocab} is below 258"
        ));
    }
    let g = json!({
        "eos_token_id": eos_token_id(vocab),
        "do_sample": true,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 40,
    });
    serde_json::to_string_pretty(&g).map_err(|e| format!("generation_config: {e}"))
}

/// `tokenizer_config.json` with `chat_template` (HF conventions): the
/// special tokens as added tokens, `<|endoftext|>` as `eos_token`, no BOS.
///
/// The reasoning and tool-call tags (`<think>`, `<minimax:tool_call>`, ...)
/// are *not* special tokens here: ids of this tokenizer are fixed by the
/// golden cases, and the byte-level BPE spells any tag exactly as bytes, so
/// the parser sees the same text either way.
pub fn tokenizer_config_json(vocab: usize, chat_template: &str) -> Result<String, String> {
    if vocab < 258 {
        return Err(format!("tokenizer_config: vocab_size {vocab} is below 258"));
    }
    let added = |content: &str| {
        json!({"content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let mut decoder = serde_json::Map::new();
    decoder.insert(eos_token_id(vocab).to_string(), added(EOS));
    decoder.insert(mask_token_id(vocab).to_string(), added(MASK));
    let t = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": false,
        "add_eos_token": false,
        "bos_token": null,
        "eos_token": EOS,
        "pad_token": null,
        "added_tokens_decoder": decoder,
        "chat_template": chat_template,
    });
    serde_json::to_string_pretty(&t).map_err(|e| format!("tokenizer_config: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection_like_gpt2() {
        let chars: std::collections::BTreeSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b' '), '\u{120}'); // "Ġ"
        assert_eq!(byte_char(b'\n'), '\u{10a}'); // "Ċ"
        assert_eq!(byte_char(b'A'), 'A');
    }

    #[test]
    fn vocab_is_exactly_full() {
        for v in [258usize, 300, 512, 4096] {
            let t: Value = serde_json::from_str(&tokenizer_json(v).unwrap()).unwrap();
            let ids: Vec<u64> = t["model"]["vocab"]
                .as_object()
                .unwrap()
                .values()
                .map(|x| x.as_u64().unwrap())
                .collect();
            assert_eq!(ids.len(), v - 2);
            assert_eq!(ids.iter().max().copied(), Some(v as u64 - 3));
            assert_eq!(t["model"]["merges"].as_array().unwrap().len(), v - 258);
        }
        assert!(tokenizer_json(257).is_err());
    }

    #[test]
    fn configs_name_the_special_tokens() {
        let g: Value = serde_json::from_str(&generation_config_json(300).unwrap()).unwrap();
        assert_eq!(g["eos_token_id"], 298);
        let t: Value =
            serde_json::from_str(&tokenizer_config_json(300, "{{ messages }}").unwrap()).unwrap();
        assert_eq!(t["eos_token"], EOS);
        assert_eq!(t["chat_template"], "{{ messages }}");
        assert_eq!(t["added_tokens_decoder"]["299"]["content"], MASK);
    }
}
