# Dev tool (benches/nvcc/README.md): writes genk_*.cu (the staged GEMV of cur_q4_0.cu / cur_q4_k.cu /
# base_q8_0_r2.cu, rendered by compile_one, with rows / chunk_div / stages / split-K variants)
# and variants.h for gemv_sweep.cu.
import re
bases = {'q4_0': ('cur_q4_0.cu', 18, 128), 'q4_k': ('cur_q4_k.cu', 144, 16), 'q8_0': ('base_q8_0_r2.cu', 34, 64)}
fmt_id = {'q4_0': 0, 'q8_0': 1, 'q4_k': 2}
table = []
decls = []
files = []
for q, (src, bb, cb) in bases.items():
    s = open(src).read()
    cut = s.index('extern "C" __global__ void __launch_bounds__(128, 1) gemv_')
    body = s[:cut]
    for r in (1, 2, 4):
        for cd in (1, 2, 4):
            t = re.sub(r'#define CB \(\d+ / \d+\)', f'#define CB ({cb} / {cd})', body)
            t = re.sub(r'#define R \d+ ', f'#define R {r} ', t)
            chunk = cb // cd
            units = (chunk * bb + 15) // 16 + 1
            sbytes = units * 16 + 16
            for st in (1, 2, 3):
                name = f'v_{q}_r{r}_c{cd}_s{st}'
                smem = 4 * st * r * sbytes
                if smem > 227 * 1024:
                    continue
                t += f'''
extern "C" __global__ void __launch_bounds__(128, 1) {name}(const u8* __restrict__ w, const float* __restrict__ x,
    const i8* __restrict__ xq, const float2* __restrict__ xds, float* __restrict__ y, int n, int k) {{
    extern __shared__ __align__(16) u8 dsm[];
    gemv_blocks<{st}>(dsm, w, xq, xds, y, n, k);
}}
'''
                decls.append(f'extern "C" __global__ void {name}(const u8*, const float*, const i8*, const float2*, float*, int, int);')
                table.append(f'{{"{name}", {name}, {fmt_id[q]}, {r}, {cd}, {st}, {smem}}},')
            fn = f'gen_{q}_r{r}_c{cd}.cu'
            open(fn, 'w').write(t)
            files.append(fn)
open('variants.h', 'w').write('\n'.join(decls) + '\nstruct Var { const char* name; void (*fn)(const u8*, const float*, const i8*, const float2*, float*, int, int); int fmt, r, cd, st, smem; };\nstatic Var VARS[] = {\n' + '\n'.join(table) + '\n};\n')
open('files.txt', 'w').write(' '.join(files))
print(len(table), 'variants', len(files), 'files')
