//! `fuzzable`: the clean build of the server `moat fuzz` is tested against;
//! no input may make it crash, hang, exhaust a limit or break its own
//! outputSchema.

fn main() -> std::io::Result<()> {
    fuzzable::run()
}
