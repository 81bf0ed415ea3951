"""Checkpoint reading (MODEL.md sections 1 and 7), written from the docs.

A checkpoint is a directory: config.json, model.safetensors.index.json
(whose weight_map is the only list of tensors) and the shards.  The
safetensors headers are parsed here (not through the safetensors package)
so that F8 dtypes come back as raw bytes whatever its version.
"""

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from . import formats as F

_DTYPES = {
    "F32": np.float32,
    "F64": np.float64,
    "F16": np.float16,
    "BF16": F.BF16,
    "I32": np.int32,
    "I64": np.int64,
    "U8": np.uint8,
    "I8": np.int8,
    "F8_E4M3": np.uint8,  # raw bytes, decoded by formats
    "F8_E5M2": np.uint8,
    "BOOL": np.bool_,
}


class CheckpointError(Exception):
    pass


def read_safetensors(path):
    """{name: (dtype_str, ndarray)} plus the metadata dict."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise CheckpointError(f"{path}: too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise CheckpointError(f"{path}: header length {hlen} past end of file")
    header = json.loads(data[8 : 8 + hlen])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name}: unsupported dtype {dt}")
        a, b = info["data_offsets"]
        arr = np.frombuffer(data, dtype=_DTYPES[dt], count=(b - a) // np.dtype(_DTYPES[dt]).itemsize, offset=base + a)
        out[name] = (dt, arr.reshape(info["shape"]))
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """Write {name: ndarray} (f32 / i32 / u8 / bf16) via temp + rename."""
    rev = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8", np.dtype(F.BF16): "BF16"}
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, tuple):  # (dtype string, array) for F8 raw bytes
            dt, arr = t
        else:
            arr = np.ascontiguousarray(t)
            dt = rev[arr.dtype]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ------------------------------------------------------------------ config


@dataclass
class Config:
    hidden_size: int
    num_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    vocab_size: int
    eps: float
    n_experts: int
    top_k: int
    moe_width: int
    shared_width: int
    dense_width: int
    routed_scaling: float
    swiglu_alpha: float
    swiglu_limit: float
    index_heads: int
    index_dim: int
    block_size: int
    topk_blocks: int
    local_blocks: int
    init_blocks: int
    index_selection: str
    attn_kinds: list = field(default_factory=list)  # "full" | "sparse"
    mlp_kinds: list = field(default_factory=list)  # "dense" | "moe"


def _req(c, *names, default=None, required=True):
    for n in names:
        if n in c and c[n] is not None:
            return c[n]
    if default is not None or not required:
        return default
    raise CheckpointError(f"config.json: missing required field {names[0]}")


def parse_config(cfg_json):
    c = dict(cfg_json)
    if isinstance(cfg_json.get("text_config"), dict):
        c.update(cfg_json["text_config"])
    sac = c.get("sparse_attention_config") or {}
    H = int(_req(c, "hidden_size"))
    L = int(_req(c, "num_hidden_layers"))
    nh = int(_req(c, "num_attention_heads"))
    kvh = int(_req(c, "num_key_value_heads"))
    d = int(_req(c, "head_dim", default=H // nh))
    if c.get("rotary_dim") is not None:
        rd = int(c["rotary_dim"])
    else:
        rd = int(d * float(_req(c, "partial_rotary_factor", default=1.0)))
    # MLP kinds: per-layer lists win over counts.
    if isinstance(c.get("mlp_layer_types"), list):
        mlp = ["moe" if x == "sparse" else "dense" for x in c["mlp_layer_types"]]
    elif isinstance(c.get("moe_layer_freq"), list):
        mlp = ["moe" if int(x) else "dense" for x in c["moe_layer_freq"]]
    else:
        k = int(_req(c, "first_k_dense", "first_k_dense_replace", default=0))
        mlp = ["dense" if i < k else "moe" for i in range(L)]
    if isinstance(c.get("layer_types"), list):
        attn = []
        for x in c["layer_types"]:
            if x == "full_attention" or x == "full":
                attn.append("full")
            elif x in ("minimax_m3_sparse", "sparse", "sparse_attention"):
                attn.append("sparse")
            else:
                raise CheckpointError(f"config.json: layer_types: unknown entry {x!r}")
    else:
        attn = ["sparse"] * L
    if len(attn) != L or len(mlp) != L:
        raise CheckpointError("config.json: per-layer type lists do not match num_hidden_layers")
    return Config(
        hidden_size=H,
        num_layers=L,
        n_heads=nh,
        n_kv_heads=kvh,
        head_dim=d,
        rotary_dim=rd,
        rope_theta=float(_req(c, "rope_theta")),
        vocab_size=int(_req(c, "vocab_size")),
        eps=float(_req(c, "rms_norm_eps")),
        n_experts=int(_req(c, "num_local_experts", default=0)),
        top_k=int(_req(c, "num_experts_per_tok", default=0)),
        moe_width=int(_req(c, "intermediate_size", default=0)),
        shared_width=int(_req(c, "shared_intermediate_size", default=0)),
        dense_width=int(_req(c, "dense_intermediate_size", default=0)),
        routed_scaling=float(_req(c, "routed_scaling_factor", default=1.0)),
        swiglu_alpha=float(_req(c, "swiglu_alpha", default=1.702)),
        swiglu_limit=float(_req(c, "swiglu_limit", default=7.0)),
        index_heads=int(_req(c, "index_n_heads", default=sac.get("sparse_num_index_heads", 0))),
        index_dim=int(_req(c, "index_head_dim", default=sac.get("sparse_index_dim", 0))),
        block_size=int(_req(c, "index_block_size", default=sac.get("sparse_block_size", 0))),
        topk_blocks=int(_req(c, "index_topk_blocks", default=sac.get("sparse_topk_blocks", 0))),
        local_blocks=int(_req(c, "index_local_blocks", default=sac.get("sparse_local_block", 1))),
        init_blocks=int(_req(c, "index_init_blocks", default=sac.get("sparse_init_block", 0))),
        index_selection=str(c.get("index_selection") or "per_kv_head"),
        attn_kinds=attn,
        mlp_kinds=mlp,
    )


# ----------------------------------------------------------------- tensors


class Checkpoint:
    """Lazy view of a checkpoint's tensors by their name without prefix."""

    def __init__(self, path):
        self.path = path
        cfgp = os.path.join(path, "config.json")
        if not os.path.exists(cfgp):
            raise CheckpointError(f"{cfgp}: not found")
        with open(cfgp) as f:
            self.config_json = json.load(f)
        self.config = parse_config(self.config_json)
        idx = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f)["weight_map"]
        else:
            single = os.path.join(path, "model.safetensors")
            t, _ = read_safetensors(single)
            wm = {k: "model.safetensors" for k in t}
        self._files = {}
        self.tensors = {}
        for name, shard in wm.items():
            if any(s in name for s in ("vision_tower", "multi_modal_projector", "patch_merge_mlp")):
                continue
            if shard not in self._files:
                self._files[shard], _ = read_safetensors(os.path.join(path, shard))
            if name not in self._files[shard]:
                raise CheckpointError(f"{shard}: tensor {name} listed in weight_map is missing")
            key = name[len("language_model."):] if name.startswith("language_model.") else name
            self.tensors[key] = self._files[shard][name]

    def has(self, name):
        return name in self.tensors

    def raw(self, name):
        if name not in self.tensors:
            raise CheckpointError(f"{self.path}: tensor {name} not found")
        return self.tensors[name]

    def f32(self, name):
        """A plain (bf16/f32/f16) tensor as f32."""
        dt, a = self.raw(name)
        if dt not in ("F32", "BF16", "F16"):
            raise CheckpointError(f"tensor {name}: expected a float tensor, got {dt}")
        return a.astype(np.float32)

    def linear(self, base, nvfp4_as_mxfp4=False):
        """Dequantized weight [out, in] f32 of linear `base` (without
        `.weight`) and its format name."""
        dt, w = self.raw(base + ".weight")
        if self.has(base + ".weight_scale_2"):
            _, s = self.raw(base + ".weight_scale")
            g = self.f32(base + ".weight_scale_2").reshape(-1)[0]
            if nvfp4_as_mxfp4:
                return F.nvfp4_to_mxfp4_values(w, s, g), "nvfp4->mxfp4"
            return F.nvfp4_dequant_f64(w, s, g).astype(np.float32), "nvfp4"
        if dt == "U8" and self.has(base + ".weight_scale"):
            _, s = self.raw(base + ".weight_scale")
            return F.mxfp4_dequant(w, s), "mxfp4"
        if dt in ("F8_E4M3", "F8_E5M2"):
            _, s = self.raw(base + ".weight_scale_inv")
            return F.mxfp8_dequant(w, s, "e4m3" if dt == "F8_E4M3" else "e5m2"), "mxfp8"
        if dt in ("BF16", "F32"):
            return w.astype(np.float32), dt.lower()
        raise CheckpointError(f"tensor {base}.weight: unknown format (dtype {dt})")

    def scalar_or(self, name, default):
        if self.has(name):
            return float(self.f32(name).reshape(-1)[0])
        return default
