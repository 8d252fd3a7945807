fn main() {
    std::process::exit(rewind::cli::main());
}
