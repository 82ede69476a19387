# Interim tool until the codegen registry serves these kernels: render kernel-templates with
# jinja2 (the templates use only the Tera/Jinja common subset) and compile them with NVRTC (ctypes).
# Usage: LD_LIBRARY_PATH=<nvrtc lib dir> python3 render_check.py a2-instances.json OUTDIR sm_90a sm_121a
import ctypes, sys, os, json, jinja2
lib = ctypes.CDLL(os.environ.get("NVRTC", "libnvrtc.so.13"))
env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")), undefined=jinja2.StrictUndefined)
def compile(src, name, arch):
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), (name + ".cu").encode(), 0, None, None)
    assert r == 0, r
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device", b"-lineinfo"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
    if r != 0:
        return None, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n)); ptx = ctypes.create_string_buffer(n.value); lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode(), log.value.decode()
# argv: instances.json outdir archs...
insts = json.load(open(sys.argv[1])); out = sys.argv[2]; archs = sys.argv[3:]
os.makedirs(out, exist_ok=True); ok = True
for inst in insts:
    if len(sys.argv) > 4 and os.environ.get("ONLY") and os.environ["ONLY"] not in inst["entry"]: continue
    for arch in archs:
        ctx = dict(inst); ctx["arch"] = arch; ctx["sm"] = int(arch[3:].rstrip("a"))
        if inst.get("min_sm", 0) > ctx["sm"]: continue
        src = env.get_template(inst["template"]).render(**ctx)
        ptx, log = compile(src, inst["entry"], arch)
        if ptx is None:
            ok = False; print(f"FAIL {inst['entry']} {arch}\n{log}"); open(f"{out}/{inst['entry']}.{arch}.cu","w").write(src); continue
        if log.strip(): print(f"warn {inst['entry']} {arch}: {log.strip()[:2000]}")
        open(f"{out}/{inst['entry']}.{arch}.ptx", "w").write(ptx)
        print(f"ok   {inst['entry']} {arch} ({len(ptx)} B)")
sys.exit(0 if ok else 1)
