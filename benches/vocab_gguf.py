#!/usr/bin/env python3
"""Write a GGUF that holds only another GGUF's metadata (tokenizer.* keys included), no tensors.

    python3 benches/vocab_gguf.py SRC.gguf OUT.gguf

`fucina bench --synth gemma4-12b --vocab OUT.gguf` copies its tokenizer from such a file. The
Gemma 3 270M file whose vocabulary the Gemma shapes take is 253 MB; its metadata alone is 6.5 MB,
small enough to carry to a machine without network (the GPU machine fetches nothing). Needs the
`gguf` package (`pip install gguf`).
"""
import sys

import gguf


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out, arch)
    for name, f in r.fields.items():
        # the header's own fields, and the architecture the writer already has
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        t = f.types[0]
        sub = f.types[-1] if t == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), t, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
