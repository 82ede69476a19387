#!/usr/bin/env python3
"""Summarise a real GGUF with the `gguf` Python package (0.19.0), as the oracle for
tests/gguf_real.rs:

    python3 golden/quant/summarize_gguf.py .cache/assets/gemma-3-270m-q4_k_m.gguf \
        golden/quant/gemma-3-270m-q4_k_m.summary.json

For every metadata key: its value type (and element type), its value for scalars, and for
arrays the length plus a sha256 (strings joined by NUL; numbers as little-endian bytes of
their own type). For every tensor: GGML dims (ne), type, absolute data offset, and the sha256
of gguf.quants.dequantize() of its first 64 rows as little-endian f32.
"""
import hashlib
import json
import sys

import numpy as np
import gguf
from gguf import GGUFValueType as V
from gguf.quants import dequantize

ROWS = 64


def main(path, out):
    r = gguf.GGUFReader(path)
    meta = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        t = V(f.types[0])
        e = {"type": t.name}
        if t == V.ARRAY:
            et = V(f.types[1]) if len(f.types) > 1 else V.UINT8
            e["elem"] = et.name
            e["len"] = len(f.data)
            h = hashlib.sha256()
            if et == V.STRING:
                h.update(b"\0".join(bytes(f.parts[i]) for i in f.data))
            elif et == V.ARRAY:
                raise SystemExit(f"{key}: nested arrays not summarised")
            else:
                for i in f.data:
                    h.update(np.asarray(f.parts[i]).tobytes())
            e["sha256"] = h.hexdigest()
        elif t == V.STRING:
            e["value"] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            v = f.parts[f.data[0]][0]
            e["value"] = bool(v) if t == V.BOOL else (float(v) if t in (V.FLOAT32, V.FLOAT64) else int(v))
        meta[key] = e
    tensors = []
    for t in r.tensors:
        ne = [int(d) for d in t.shape]
        rows = t.data if t.data.ndim > 1 else t.data.reshape(1, -1)
        rows = rows.reshape(-1, rows.shape[-1])[:ROWS]
        deq = dequantize(np.ascontiguousarray(rows), t.tensor_type).astype("<f4")
        tensors.append({
            "name": t.name,
            "ne": ne,
            "type": t.tensor_type.name,
            "offset": int(t.data_offset),
            "rows_hashed": int(deq.reshape(-1, ne[0]).shape[0]),
            "sha256": hashlib.sha256(deq.tobytes()).hexdigest(),
        })
    with open(out, "w") as fh:
        json.dump({"version": int(r.fields["GGUF.version"].parts[-1][0]), "metadata": meta, "tensors": tensors}, fh, indent=1, ensure_ascii=False)
        fh.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
