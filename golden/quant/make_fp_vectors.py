#!/usr/bin/env python3
"""Reference vectors for the safetensors low-precision formats, from numpy + ml_dtypes codecs.

    pip install numpy ml_dtypes   # committed files were made with numpy 2.4.6, ml_dtypes 0.6.0
    python3 golden/quant/make_fp_vectors.py     # writes golden/quant/fp/*

fp/model.safetensors (+ fp/config.json with quantization_config.weight_block_size) holds, as real
checkpoints name them:
  blk.weight            F8_E4M3 [200, 136] + weight_scale_inv F32 [2, 2]   (128x128 blocks, partial edges)
  blkbf.weight          F8_E4M3 [130, 32] + weight_scale_inv BF16 [2, 1]
  mo_nvfp4.weight       U8 [48, 32] + weight_scale F8_E4M3 [48, 4] + weight_scale_2 F32 []  (ModelOpt NVFP4)
  mo_fp8.weight         F8_E4M3 [40, 24] + weight_scale F32 [] (+ input_scale)             (ModelOpt FP8 per tensor)
  ct_nvfp4.weight_packed U8 [48, 32] + weight_scale F8_E4M3 [48, 4] + weight_global_scale F32 [1]
                                                   (compressed-tensors NVFP4, global stored as reciprocal)
  ct_fp8.weight         F8_E4M3 [40, 24] + weight_scale BF16 [40, 1]       (compressed-tensors per row)
  raw8.weight           F8_E4M3 [8, 16], no scale
  norm.weight           BF16 [24]
fp/e4m3_encode.safetensors: `x` F32 [N] (random magnitudes over every binade up to 460, exact
ties, subnormals, zeros) and `code` U8 [N] = ml_dtypes' round-to-nearest-even float8_e4m3fn
encoding of x, the oracle for fucina's f32 -> E4M3 encoder (used for FP8 KV caches).
fp/expected.safetensors: the same logical names (`X.weight`), F32, dequantised here with
ml_dtypes' float8_e4m3fn / float4_e2m1fn / bfloat16 codecs and float32 products in the order
value * block_scale (* global), which tests/quant_formats.rs compares bit for bit.
"""
import json
import os

import numpy as np
import ml_dtypes

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp")
rng = np.random.default_rng(1129)
F8 = ml_dtypes.float8_e4m3fn
F4 = ml_dtypes.float4_e2m1fn
BF16 = ml_dtypes.bfloat16


def save(path, tensors):
    """Minimal safetensors writer: name -> (dtype string, shape, raw bytes)."""
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def fp8_codes(shape, positive=False):
    """Random E4M3FN codes, NaN (0x7f/0xff) excluded."""
    c = rng.integers(0, 0x7F if positive else 0x100, size=shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x7E
    return c


def f8(c):
    return c.view(F8).astype(np.float32)


def f32(x):
    return np.asarray(x, dtype=np.float32)


def scales(shape):
    return f32(rng.uniform(0.5, 2.0, size=shape) * np.exp2(rng.integers(-12, -4, size=shape)))


def nvfp4(rows, cols):
    packed = rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
    lo, hi = packed & 0x0F, packed >> 4
    nib = np.stack([lo, hi], axis=-1).reshape(rows, cols)  # low nibble = element 2j
    vals = nib.view(F4).astype(np.float32)
    sc = fp8_codes((rows, cols // 16), positive=True)
    return packed, vals, sc


def main():
    os.makedirs(OUT, exist_ok=True)
    model, expected = {}, {}

    def exp(name, v):
        v = f32(v)
        expected[name] = ("F32", v.shape, v.tobytes())

    # FP8 128x128 block scales, F32 and BF16 scale tensors
    w = fp8_codes((200, 136))
    s = scales((2, 2))
    model["blk.weight"] = ("F8_E4M3", w.shape, w.tobytes())
    model["blk.weight_scale_inv"] = ("F32", s.shape, s.tobytes())
    r, c = np.arange(200)[:, None] // 128, np.arange(136)[None, :] // 128
    exp("blk.weight", f8(w) * s[r, c])
    w = fp8_codes((130, 32))
    s = scales((2, 1)).astype(BF16)
    model["blkbf.weight"] = ("F8_E4M3", w.shape, w.tobytes())
    model["blkbf.weight_scale_inv"] = ("BF16", s.shape, s.tobytes())
    exp("blkbf.weight", f8(w) * s.astype(np.float32)[np.arange(130)[:, None] // 128, np.zeros((1, 32), int)])

    # ModelOpt NVFP4
    packed, vals, sc = nvfp4(48, 64)
    g = f32(rng.uniform(1e-4, 1e-2))
    model["mo_nvfp4.weight"] = ("U8", packed.shape, packed.tobytes())
    model["mo_nvfp4.weight_scale"] = ("F8_E4M3", sc.shape, sc.tobytes())
    model["mo_nvfp4.weight_scale_2"] = ("F32", (), g.tobytes())
    model["mo_nvfp4.input_scale"] = ("F32", (), f32(0.5).tobytes())
    exp("mo_nvfp4.weight", (vals * np.repeat(f8(sc), 16, axis=1)) * g)

    # ModelOpt FP8 per tensor
    w = fp8_codes((40, 24))
    s = f32(rng.uniform(1e-3, 1e-1))
    model["mo_fp8.weight"] = ("F8_E4M3", w.shape, w.tobytes())
    model["mo_fp8.weight_scale"] = ("F32", (), s.tobytes())
    model["mo_fp8.input_scale"] = ("F32", (), f32(0.25).tobytes())
    exp("mo_fp8.weight", f8(w) * s)

    # compressed-tensors NVFP4: weight_global_scale is the reciprocal of the multiplier
    packed, vals, sc = nvfp4(48, 64)
    gs = f32([rng.uniform(100.0, 10000.0)])
    model["ct_nvfp4.weight_packed"] = ("U8", packed.shape, packed.tobytes())
    model["ct_nvfp4.weight_scale"] = ("F8_E4M3", sc.shape, sc.tobytes())
    model["ct_nvfp4.weight_global_scale"] = ("F32", gs.shape, gs.tobytes())
    exp("ct_nvfp4.weight", (vals * np.repeat(f8(sc), 16, axis=1)) * (np.float32(1.0) / gs[0]))

    # compressed-tensors FP8 per output row
    w = fp8_codes((40, 24))
    s = scales((40, 1)).astype(BF16)
    model["ct_fp8.weight"] = ("F8_E4M3", w.shape, w.tobytes())
    model["ct_fp8.weight_scale"] = ("BF16", s.shape, s.tobytes())
    exp("ct_fp8.weight", f8(w) * s.astype(np.float32))

    # FP8 without a scale, and a plain BF16 vector
    w = fp8_codes((8, 16))
    model["raw8.weight"] = ("F8_E4M3", w.shape, w.tobytes())
    exp("raw8.weight", f8(w))
    v = f32(rng.normal(size=24)).astype(BF16)
    model["norm.weight"] = ("BF16", v.shape, v.tobytes())
    exp("norm.weight", v.astype(np.float32))

    # f32 -> E4M3 encoding (below 464, where ml_dtypes rounds to 448 rather than NaN)
    mags = np.exp2(rng.uniform(-12, np.log2(460), size=3000))
    grid = np.arange(0, 0x7E, dtype=np.uint8).view(F8).astype(np.float32)
    ties = (grid[:-1] + grid[1:]) / 2  # exact midpoints between neighbours
    x = np.concatenate([mags, -mags[:500], ties, -ties, grid, [0.0, -0.0, 2.0**-10, 2.0**-11, 459.0]]).astype(np.float32)
    code = x.astype(F8).view(np.uint8)
    save(os.path.join(OUT, "e4m3_encode.safetensors"), {"x": ("F32", x.shape, x.tobytes()), "code": ("U8", code.shape, code.tobytes())})

    save(os.path.join(OUT, "model.safetensors"), model)
    save(os.path.join(OUT, "expected.safetensors"), expected)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
