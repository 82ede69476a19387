//! Runs the GPU kernel selftest until the CLI's `fucina selftest` is wired:
//! `cargo run --example selftest -- [--filter rope] [--generic] [--strict-kernels]`.

use clap::Parser;

#[derive(Parser)]
#[command(about = "fucina kernel selftest: every instance vs the CPU reference")]
struct Cli {
    #[command(flatten)]
    args: fucina::selftest::SelftestArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match fucina::selftest::run(&cli.args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("selftest: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
