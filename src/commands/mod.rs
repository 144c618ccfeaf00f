//! One module per subcommand: each holds its arguments, calls moat-host
//! for the work, and prints what comes back.

pub mod add;
pub mod audit;
pub mod call;
pub mod claim;
pub mod digest;
pub mod fuzz;
pub mod import;
pub mod inspect;
pub mod key;
pub mod learn;
pub mod lock;
pub mod node;
pub mod pull;
pub mod revoke;
pub mod serve;
pub mod tools;
pub mod update;

/// A warning the library hands the command line (a lock entry the gateway
/// could not expose, say): one line on stderr.
pub fn warn(problem: &dyn std::error::Error) {
    eprintln!("moat: warning: {problem}");
}
