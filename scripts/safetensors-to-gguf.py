#!/usr/bin/env python3
"""Writes a Llama-family safetensors checkpoint (config.json + model.safetensors, F16/BF16/F32) as a
GGUF v3 file with the same weights, for side-by-side runs of Ember and llama.cpp on one file
(llama.cpp's llama-quantize then makes its Q8_0 / Q4_0 / Q4_K_M files from it).

    scripts/safetensors-to-gguf.py MODEL_DIR OUT.gguf [--tokenizer DIR]

Matrices are stored in the checkpoint's dtype (F16, BF16 or F32), 1-D tensors (norms) as F32; q and
k rows are permuted the way llama.cpp's converter lays them out for its RoPE (Ember's GGUF loader
undoes it). rope_scaling is not carried over (the file is for speed comparisons). The vocabulary is the tokenizer.json byte-level BPE ("gpt2" model, merges, added
tokens as control tokens, pre-tokenizer "llama-bpe") of MODEL_DIR or --tokenizer DIR. Only the
plain-Python standard library is used; tensors are copied in 16 MiB pieces.
"""
import argparse
import json
import os
import struct
import sys

GGUF_MAGIC = b"GGUF"
ALIGNMENT = 32
# GGUF metadata value types and ggml tensor types used here.
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64 = 4, 5, 6, 7, 8, 9, 10
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
DTYPES = {"F32": (GGML_F32, 4), "F16": (GGML_F16, 2), "BF16": (GGML_BF16, 2)}


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype, value):
    if vtype == T_STRING:
        return gguf_string(value)
    if vtype == T_UINT32:
        return struct.pack("<I", value)
    if vtype == T_INT32:
        return struct.pack("<i", value)
    if vtype == T_FLOAT32:
        return struct.pack("<f", value)
    if vtype == T_BOOL:
        return struct.pack("<?", value)
    if vtype == T_UINT64:
        return struct.pack("<Q", value)
    raise ValueError(vtype)


def gguf_kv(key, vtype, value):
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == T_ARRAY:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        out += b"".join(gguf_value(etype, v) for v in items)
        return out
    return out + gguf_value(vtype, value)


class SafeTensors:
    """The tensors of model.safetensors or of the shards its index names."""

    def __init__(self, model_dir):
        self.entries = {}
        index = os.path.join(model_dir, "model.safetensors.index.json")
        files = ([os.path.join(model_dir, "model.safetensors")] if not os.path.exists(index) else
                 sorted({os.path.join(model_dir, f) for f in json.load(open(index))["weight_map"].values()}))
        for path in files:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            for name, info in header.items():
                if name != "__metadata__":
                    self.entries[name] = (path, 8 + n + info["data_offsets"][0],
                                          info["data_offsets"][1] - info["data_offsets"][0],
                                          info["dtype"], info["shape"])

    def read(self, name):
        path, offset, size, _, _ = self.entries[name]
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)


def to_f32(raw, dtype):
    if dtype == "F32":
        return raw
    n = len(raw) // 2
    if dtype == "F16":
        return struct.pack("<%df" % n, *struct.unpack("<%de" % n, raw))
    words = struct.unpack("<%dH" % n, raw)  # BF16: the high half of an f32
    return struct.pack("<%dI" % n, *[w << 16 for w in words])


def permute_rows(raw, rows, row_bytes, heads):
    """llama.cpp's q/k layout: within each head, rows (half, i) -> (i, half)."""
    head_dim = rows // heads
    half = head_dim // 2
    out = bytearray(len(raw))
    for h in range(heads):
        for i in range(half):
            for s in range(2):
                src = h * head_dim + s * half + i
                dst = h * head_dim + 2 * i + s
                out[dst * row_bytes:(dst + 1) * row_bytes] = raw[src * row_bytes:(src + 1) * row_bytes]
    return bytes(out)


def vocabulary(tokenizer_dir):
    tok = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        sys.exit("only byte-level BPE tokenizer.json files are written (got %s)" % model.get("type"))
    tokens = {i: t for t, i in model["vocab"].items()}
    control = set()
    for added in tok.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        if added.get("special"):
            control.add(added["id"])
    size = max(tokens) + 1
    names = [tokens.get(i, "[PAD%d]" % i) for i in range(size)]
    types = [3 if i in control else (1 if i in tokens else 5) for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return names, types, merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (default: MODEL_DIR)")
    args = ap.parse_args()
    config = json.load(open(os.path.join(args.model_dir, "config.json")))
    if config.get("model_type") not in ("llama", "mistral"):
        sys.exit("only llama / mistral checkpoints are written (got %s)" % config.get("model_type"))
    st = SafeTensors(args.model_dir)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or hidden // heads
    names, types, merges = vocabulary(args.tokenizer or args.model_dir)
    if len(names) != config["vocab_size"]:
        names += ["[PAD%d]" % i for i in range(len(names), config["vocab_size"])]
        types += [5] * (config["vocab_size"] - len(types))

    kv = [
        gguf_kv("general.architecture", T_STRING, "llama"),
        gguf_kv("general.name", T_STRING, os.path.basename(os.path.abspath(args.model_dir))),
        gguf_kv("general.alignment", T_UINT32, ALIGNMENT),
        gguf_kv("llama.context_length", T_UINT32, config.get("max_position_embeddings", 4096)),
        gguf_kv("llama.embedding_length", T_UINT32, hidden),
        gguf_kv("llama.block_count", T_UINT32, layers),
        gguf_kv("llama.feed_forward_length", T_UINT32, config["intermediate_size"]),
        gguf_kv("llama.attention.head_count", T_UINT32, heads),
        gguf_kv("llama.attention.head_count_kv", T_UINT32, kv_heads),
        gguf_kv("llama.attention.key_length", T_UINT32, head_dim),
        gguf_kv("llama.attention.value_length", T_UINT32, head_dim),
        gguf_kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, config.get("rms_norm_eps", 1e-5)),
        gguf_kv("llama.rope.freq_base", T_FLOAT32, config.get("rope_theta", 10000.0)),
        gguf_kv("llama.rope.dimension_count", T_UINT32, head_dim),
        gguf_kv("llama.vocab_size", T_UINT32, config["vocab_size"]),
        gguf_kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        gguf_kv("tokenizer.ggml.pre", T_STRING, "llama-bpe"),
        gguf_kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, names)),
        gguf_kv("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types)),
        gguf_kv("tokenizer.ggml.merges", T_ARRAY, (T_STRING, merges)),
    ]
    for key, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        value = config.get(field)
        if isinstance(value, list):
            value = value[0]
        if isinstance(value, int):
            kv.append(gguf_kv("tokenizer.ggml." + key, T_UINT32, value))
    if config.get("rope_scaling"):
        print("note: rope_scaling is not written (plain RoPE at rope_theta): the file is for "
              "speed comparisons, its logits differ from the checkpoint's", file=sys.stderr)

    # (gguf name, safetensors name, permute heads or 0)
    plan = [("token_embd.weight", "model.embed_tokens.weight", 0)]
    for i in range(layers):
        p = "model.layers.%d." % i
        plan += [("blk.%d.attn_norm.weight" % i, p + "input_layernorm.weight", 0),
                 ("blk.%d.attn_q.weight" % i, p + "self_attn.q_proj.weight", heads),
                 ("blk.%d.attn_k.weight" % i, p + "self_attn.k_proj.weight", kv_heads),
                 ("blk.%d.attn_v.weight" % i, p + "self_attn.v_proj.weight", 0),
                 ("blk.%d.attn_output.weight" % i, p + "self_attn.o_proj.weight", 0),
                 ("blk.%d.ffn_norm.weight" % i, p + "post_attention_layernorm.weight", 0),
                 ("blk.%d.ffn_gate.weight" % i, p + "mlp.gate_proj.weight", 0),
                 ("blk.%d.ffn_up.weight" % i, p + "mlp.up_proj.weight", 0),
                 ("blk.%d.ffn_down.weight" % i, p + "mlp.down_proj.weight", 0)]
    plan.append(("output_norm.weight", "model.norm.weight", 0))
    if "lm_head.weight" in st.entries and not config.get("tie_word_embeddings", False):
        plan.append(("output.weight", "lm_head.weight", 0))

    infos, offset = [], 0
    for gname, sname, _ in plan:
        if sname not in st.entries:
            sys.exit("missing tensor " + sname)
        _, _, size, dtype, shape = st.entries[sname]
        if dtype not in DTYPES:
            sys.exit("%s: dtype %s is not written" % (sname, dtype))
        ggml_type, elem = DTYPES[dtype] if len(shape) == 2 else (GGML_F32, 4)
        nbytes = size // DTYPES[dtype][1] * elem
        infos.append((gname, sname, shape, ggml_type, offset, nbytes))
        offset += (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT

    with open(args.out, "wb") as out:
        out.write(GGUF_MAGIC + struct.pack("<IQQ", 3, len(infos), len(kv)))
        for item in kv:
            out.write(item)
        for gname, _, shape, ggml_type, off, _ in infos:
            dims = list(reversed(shape))  # ggml order: the row length first
            out.write(gguf_string(gname) + struct.pack("<I", len(dims)))
            out.write(struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", ggml_type, off))
        out.write(b"\0" * ((-out.tell()) % ALIGNMENT))
        data_start = out.tell()
        for (gname, sname, shape, ggml_type, off, nbytes), (_, _, heads_) in zip(infos, plan):
            raw = st.read(sname)
            dtype = st.entries[sname][3]
            if len(shape) != 2:
                raw = to_f32(raw, dtype)
            elif heads_:
                raw = permute_rows(raw, shape[0], len(raw) // shape[0], heads_)
            out.seek(data_start + off)
            out.write(raw)
            assert len(raw) == nbytes, gname
        out.truncate()
    print("wrote %s: %d tensors, %d metadata keys" % (args.out, len(infos), len(kv)))


if __name__ == "__main__":
    main()
