#!/usr/bin/env python3
"""Reference vectors for GGML block dequantisation, made with the `gguf` Python package.

    pip install gguf==0.19.0 numpy        # committed files were made with numpy 2.4.6
    python3 golden/quant/make_vectors.py        # writes golden/quant/{blocks,expected}.gguf

blocks.gguf   one tensor per type (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K) holding
              random blocks (random bytes, with the f16 scale fields overwritten by sane random
              f16 values, since gguf-py can only dequantise K-quants, not make them), plus a
              metadata zoo of every GGUF value type and a nested array, all written by gguf-py's
              GGUFWriter (an implementation independent of fucina's reader).
expected.gguf the same tensor names, F32, holding gguf.quants.dequantize() of each.
tests/quant_reference.rs compares fucina's dequantisation with expected.gguf bit for bit.
"""
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize


OUT = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261129)

# (type, rows, blocks per row, byte offsets of f16 scale fields in a block)
SPECS = [
    (T.F32, 4, 24, []),
    (T.F16, 4, 24, []),
    (T.BF16, 4, 24, []),
    (T.Q4_0, 8, 4, [0]),
    (T.Q4_1, 8, 4, [0, 2]),
    (T.Q5_0, 8, 4, [0]),
    (T.Q5_1, 8, 4, [0, 2]),
    (T.Q8_0, 8, 4, [0]),
    (T.Q4_K, 4, 2, [0, 2]),
    (T.Q5_K, 4, 2, [0, 2]),
    (T.Q6_K, 4, 2, [208]),
]


def sane_f16(n):
    """Finite f16 values spanning several binades, both signs, a few subnormals and zeros."""
    v = rng.normal(size=n) * np.exp2(rng.integers(-12, 3, size=n))
    v[rng.random(n) < 0.03] = 0.0
    v[rng.random(n) < 0.03] = rng.normal() * 2.0**-20  # f16 subnormal
    return v.astype(np.float16)


def blocks(qtype, rows, per_row, scale_offsets):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * per_row
    if qtype == T.F32:
        data = (rng.normal(size=n_blocks) * np.exp2(rng.integers(-30, 30, size=n_blocks))).astype(np.float32)
        return data.view(np.uint8).reshape(rows, -1)
    if qtype == T.F16:
        return sane_f16(n_blocks).view(np.uint8).reshape(rows, -1)
    if qtype == T.BF16:
        f = (rng.normal(size=n_blocks) * np.exp2(rng.integers(-60, 60, size=n_blocks))).astype(np.float32)
        b = (f.view(np.uint32) >> 16).astype(np.uint16)
        return b.view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in scale_offsets:
        raw[:, off:off + 2] = sane_f16(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, per_row * type_size)


def main():
    bw = gguf.GGUFWriter(os.path.join(OUT, "blocks.gguf"), "fucina-quant-vectors")
    ew = gguf.GGUFWriter(os.path.join(OUT, "expected.gguf"), "fucina-quant-vectors")
    # metadata zoo (every value type; nested array)
    bw.add_uint8("zoo.u8", 200)
    bw.add_int8("zoo.i8", -5)
    bw.add_uint16("zoo.u16", 65000)
    bw.add_int16("zoo.i16", -30000)
    bw.add_uint32("zoo.u32", 4000000000)
    bw.add_int32("zoo.i32", -2000000000)
    bw.add_float32("zoo.f32", 1.5)
    bw.add_uint64("zoo.u64", 2**64 - 2)
    bw.add_int64("zoo.i64", -(2**62))
    bw.add_float64("zoo.f64", -2.25)
    bw.add_bool("zoo.bool", True)
    bw.add_string("zoo.str", "héllo ✓ 日本")
    bw.add_array("zoo.strs", ["a", "", "<s>"])
    bw.add_array("zoo.ints", [1, -2, 3])
    bw.add_array("zoo.nested", [[1, 2], [3]])
    for qtype, rows, per_row, offs in SPECS:
        block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
        data = blocks(qtype, rows, per_row, offs)
        cols = per_row * block_size
        deq = dequantize(data, qtype).astype(np.float32).reshape(rows, cols)
        assert np.all(np.isfinite(deq)), qtype.name
        bw.add_tensor(qtype.name, data, raw_dtype=qtype)  # byte shape -> logical (rows, cols)
        ew.add_tensor(qtype.name, deq)
    for w in (bw, ew):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    main()
