#!/usr/bin/python3
"""Writes src/model/testdata/gguf_dequant_golden.txt: llama.cpp gguf-py's numpy dequantization of
(a) random-but-valid blocks (plus edge cases) of every ggml type Ember reads and (b) every tensor
of the GGUF fixtures. gguf_dequant_test compares Ember's DequantizeRow against it bitwise.

Needs numpy (Debian: apt-get install -y python3-numpy; run with /usr/bin/python3) and a llama.cpp
source tree for its gguf-py (git-ignored, never committed): --gguf-py DIR (the folder holding the
`gguf` package), default $LLAMA_CPP_DIR/gguf-py with LLAMA_CPP_DIR defaulting to .cache/llama.cpp.
MXFP4 needs a gguf-py from August 2025 or later; types a gguf-py lacks are left out with a warning
(and gguf_dequant_test then fails, naming them).

Golden lines (space-separated; floats as the hex of their float32 bits; CRC-32 as zlib's, over
the little-endian float32 bytes of the dequantized values):
  block TYPE CASE NUM_ELEMENTS CRC32 INPUT_HEX FIRST_BLOCK_OUTPUT_HEX
  tensor FILE TENSOR TYPE NUM_ELEMENTS TENSOR_CRC32 ROW0_CRC32 ROW0_FIRST16_HEX
"""
import argparse
import importlib
import os
import sys
import types
import zlib

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
         "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]


def load_gguf_py(path):
    """Imports gguf.constants/quants/gguf_reader without gguf/__init__ (which needs
    sentencepiece and friends)."""
    package_dir = os.path.join(path, "gguf")
    if not os.path.isfile(os.path.join(package_dir, "quants.py")):
        sys.exit(f"no gguf-py at {path} (want {package_dir}/quants.py); pass --gguf-py or set "
                 "LLAMA_CPP_DIR to a llama.cpp source tree")
    package = types.ModuleType("gguf")
    package.__path__ = [package_dir]
    sys.modules["gguf"] = package
    return (importlib.import_module("gguf.constants"), importlib.import_module("gguf.quants"),
            importlib.import_module("gguf.gguf_reader"))


def f16_bits_finite(rng, n):
    """Random float16 bit patterns that are finite (any sign, normal or subnormal)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exponent_all_ones] &= 0xBBFF  # clear one exponent bit: finite
    return bits


def f16_bytes(values_bits):
    return np.asarray(values_bits, dtype=np.uint16).view(np.uint8)


def random_block(rng, name):
    """One random-but-valid block of `name` as bytes, fields in ggml struct order."""
    def u8(n):
        return rng.integers(0, 256, size=n, dtype=np.uint32).astype(np.uint8)

    def half(n=1):
        return f16_bytes(f16_bits_finite(rng, n))

    layout = {
        "Q4_0": lambda: [half(), u8(16)],
        "Q4_1": lambda: [half(2), u8(16)],
        "Q5_0": lambda: [half(), u8(4), u8(16)],
        "Q5_1": lambda: [half(2), u8(4), u8(16)],
        "Q8_0": lambda: [half(), u8(32)],
        "Q2_K": lambda: [u8(16), u8(64), half(2)],
        "Q3_K": lambda: [u8(32), u8(64), u8(12), half()],
        "Q4_K": lambda: [half(2), u8(12), u8(128)],
        "Q5_K": lambda: [half(2), u8(12), u8(32), u8(128)],
        "Q6_K": lambda: [u8(128), u8(64), u8(16), half()],
        "IQ4_NL": lambda: [half(), u8(16)],
        "IQ4_XS": lambda: [half(), u8(2), u8(4), u8(128)],
        "MXFP4": lambda: [u8(1), u8(16)],
    }[name]
    return np.concatenate(layout())


def random_plain(rng, name, n):
    if name == "F32":
        values = rng.standard_normal(n).astype(np.float32) * np.float32(10.0) ** rng.integers(
            -30, 30, size=n).astype(np.float32)
        return values.astype(np.float32).view(np.uint8)
    if name == "F16":
        return f16_bytes(f16_bits_finite(rng, n))
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)  # BF16
    bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF  # finite
    return bits.view(np.uint8)


def edge_cases():
    """Hand-picked inputs: zeros, subnormals, extremes, infinities, a quiet NaN."""
    f32 = np.array([0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
                    0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x3F800000, 0xBF800000,
                    0x3EAAAAAB, 0x80000001, 0x4B000000, 0x33800000], dtype=np.uint32)
    f16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00,
           0x3C00, 0xBC00, 0x3555, 0x8001, 0x83FF, 0x4000]
    bf16 = [0x0000, 0x8000, 0x0001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0,
            0x3F80, 0xBF80, 0x3EAB, 0x8001, 0x4B00, 0xC2F7]
    every_nibble = np.array([l | ((15 - l) << 4) for l in range(16)], dtype=np.uint8)
    mxfp4 = np.concatenate([np.concatenate([[e], every_nibble]).astype(np.uint8)
                            for e in (0, 1, 2, 127, 254, 255)])
    q8_0 = np.concatenate([np.concatenate([f16_bytes([d]), np.arange(-128, 128, 8).astype(
        np.int8).view(np.uint8)]) for d in (0x0001, 0x7BFF, 0x8400)])
    return [("F32", f32.view(np.uint8)), ("F16", f16_bytes(f16)),
            ("BF16", np.array(bf16, dtype=np.uint16).view(np.uint8)),
            ("MXFP4", mxfp4), ("Q8_0", q8_0)]


def hex_floats(values):
    return "".join(f"{int(b):08x}" for b in np.asarray(values, dtype=np.float32).view(np.uint32))


def crc(values):
    return f"{zlib.crc32(np.ascontiguousarray(values, dtype=np.float32).tobytes()):08x}"


def block_line(constants, quants, name, case, data):
    qtype = constants.GGMLQuantizationType[name]
    block_size, type_size = constants.GGML_QUANT_SIZES[qtype]
    out = quants.dequantize(data.reshape((1, -1)), qtype).reshape(-1).astype(np.float32, copy=False)
    assert out.size == data.size // type_size * block_size
    first = out[: max(block_size, 16)]  # the first block (16 values of a plain type)
    return f"block {name} {case} {out.size} {crc(out)} {data.tobytes().hex()} {hex_floats(first)}"


def tensor_lines(constants, quants, reader_module, path):
    reader = reader_module.GGUFReader(path)
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        data = np.ascontiguousarray(tensor.data)
        out = quants.dequantize(data, tensor.tensor_type).astype(np.float32, copy=False)
        out = out.reshape(-1)
        row_length = int(tensor.shape[0])
        row0 = out[:row_length]
        yield (f"tensor {os.path.basename(path)} {tensor.name} {name} {out.size} {crc(out)} "
               f"{crc(row0)} {hex_floats(row0[:16])}")


def main():
    llama_dir = os.environ.get("LLAMA_CPP_DIR", os.path.join(REPO, ".cache", "llama.cpp"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf-py", default=os.path.join(llama_dir, "gguf-py"))
    parser.add_argument("--fixtures", default=os.environ.get(
        "EMBER_FIXTURES", os.path.join(REPO, "..", "shared", "fixtures")))
    parser.add_argument("--out", default=os.path.join(
        REPO, "src", "model", "testdata", "gguf_dequant_golden.txt"))
    parser.add_argument("--seed", type=int, default=20260101)
    parser.add_argument("--source-note", default="llama.cpp gguf-py",
                        help="which gguf-py made the golden (written into its first line)")
    args = parser.parse_args()

    constants, quants, reader_module = load_gguf_py(args.gguf_py)
    rng = np.random.default_rng(args.seed)
    lines = [f"# made by scripts/gguf-dequant-reference.py (seed {args.seed}) with "
             f"{args.source_note}; numpy {np.__version__}"]
    available = [t for t in TYPES if hasattr(constants.GGMLQuantizationType, t)]
    for missing in sorted(set(TYPES) - set(available)):
        print(f"warning: this gguf-py has no {missing}; left out", file=sys.stderr)
    for name in available:
        block_size, _ = constants.GGML_QUANT_SIZES[constants.GGMLQuantizationType[name]]
        if block_size == 1:
            data = random_plain(rng, name, 64)
        else:
            num_blocks = 4 if block_size == 256 else 8
            data = np.concatenate([random_block(rng, name) for _ in range(num_blocks)])
        lines.append(block_line(constants, quants, name, "random", data))
    for name, data in edge_cases():
        if name in available:
            lines.append(block_line(constants, quants, name, "edge", data))
    gguf_dir = os.path.join(args.fixtures, "gguf")
    for file_name in sorted(os.listdir(gguf_dir)):
        if file_name.endswith(".gguf"):
            lines.extend(tensor_lines(constants, quants, reader_module,
                                      os.path.join(gguf_dir, file_name)))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {len(lines) - 1} cases, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
