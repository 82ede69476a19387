"""Render the MoE kernel templates (and the verified bf16 gemm, the emulator's own check) for the
host emulator: lib includes dropped (emu.h provides those functions), the one inline-asm helper of
moe_gemm replaced by its software twin. Usage: render.py OUT_DIR"""
import os
import re
import sys

import jinja2

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'kernel-templates')


def render(name, **ctx):
    src = open(os.path.join(ROOT, 'ops', name + '.cu.tera')).read()
    src = re.sub(r'\{%\s*include[^%]*%\}', '', src)
    out = jinja2.Environment().from_string(src).render(**ctx)
    out = re.sub(r'__device__ __forceinline__ u32 cvt_bf16x2\(float lo, float hi\) \{.*?\n\}',
                 '__device__ __forceinline__ u32 cvt_bf16x2(float lo, float hi) { return host_bf16x2(lo, hi); }',
                 out, flags=re.S)
    if 'asm(' in out or 'asm volatile' in out:
        sys.exit(f'{name}: inline asm left after rendering')
    return out


out_dir = sys.argv[1]
for q in ['q4_0', 'q8_0', 'q4_k', 'q6_k']:
    open(os.path.join(out_dir, f'gemm_{q}.inc'), 'w').write(
        render('moe_gemm', quant=q, bm=64, entry='kgemm', sm=90))
open(os.path.join(out_dir, 'group.inc'), 'w').write(
    render('moe_group', quant='f32', max_experts=256, entry='kgroup', sm=90))
open(os.path.join(out_dir, 'dense.inc'), 'w').write(render('gemm', quant='bf16', entry='kdense', sm=90))
