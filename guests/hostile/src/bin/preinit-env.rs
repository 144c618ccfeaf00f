//! Its initialiser (`wizer-initialize`) reads an environment variable.
//! wasi-libc reads the environment once and keeps it: in a snapshot every
//! instance would see the initialiser's (empty) environment, never its own
//! `env` grant.
moat_wit::preinit!(config);

fn config() -> Option<String> {
    std::env::var("PREINIT_CONFIG").ok()
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs:
    // `attack` answers with what `main` reads.
    let config = moat_wit::preinitialized(config);
    hostile::serve("preinit-env", move |id: &serde_json::Value| {
        Some(hostile::text_result(
            id,
            config.as_deref().unwrap_or("unset"),
        ))
    });
}
