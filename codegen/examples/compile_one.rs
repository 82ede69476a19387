//! Dev tool: render every instance whose entry name contains the first argument and compile it
//! with NVRTC, printing ptxas-free PTX stats (lines, mma count) or the compile log.
//! `cargo run -p codegen --example compile_one -- attn_decode_fp8_e4m3_hd128_sm_90a [out.ptx]`
//! An output path ending in `.cu` receives the rendered CUDA source instead of the PTX.
//! `FUCINA_DEV_DEFINES="A=1,B"` puts `#define` lines in front of every source, as the engine does.
fn main() {
    let defines: String = std::env::var("FUCINA_DEV_DEFINES")
        .unwrap_or_default()
        .split(',')
        .filter(|d| !d.trim().is_empty())
        .map(|d| match d.trim().split_once('=') {
            Some((k, v)) => format!("#define {k} {v}\n"),
            None => format!("#define {}\n", d.trim()),
        })
        .collect();
    let args: Vec<String> = std::env::args().collect();
    let pat = args.get(1).cloned().unwrap_or_default();
    let dir = codegen::default_templates_dir();
    let all = codegen::render_all(&dir).expect("render");
    for (inst, src) in all {
        let src = format!("{defines}{src}");
        let name = inst.name().to_string();
        if !name.contains(&pat) {
            continue;
        }
        if let Some(out) = args.get(2).filter(|o| o.ends_with(".cu")) {
            std::fs::write(out, &src).expect("write");
            println!("{name}: source written to {out}");
            continue;
        }
        match codegen::ptx::compile(&name, &src, inst.key.arch) {
            Ok(ptx) => {
                println!(
                    "{name}: {} lines, {} mma, {} entries",
                    ptx.lines().count(),
                    ptx.matches("mma.sync").count(),
                    ptx.matches(".entry").count()
                );
                if let Some(out) = args.get(2) {
                    std::fs::write(out, &ptx).expect("write");
                }
            }
            Err(e) => println!("{name}: FAILED {e}"),
        }
    }
}
