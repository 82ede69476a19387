fn main() -> std::process::ExitCode {
    fucina::cli::main()
}
