use holdfast_cli::conn::{self, ConnArgs};
use holdfast_cli::exit;
use holdfast_model::{LockKey, Token};
use std::io::BufRead;

/// The exit status for a token that is not the current holder's.
pub const INVALID_TOKEN: u8 = 1;

pub const VALIDATE_HELP: &str = "\
The token is read from the HOLDFAST_TOKEN environment variable (which
`holdfastctl lock exec` sets for its command) or, when that is not set, from
the first line of standard input. It is never taken from the command line,
where `ps` shows it to every user, and never printed.

The arbiter compares it with the current hold of KEY in a linearizable read:
valid only while the hold that token was granted for still exists, in the
epoch the arbiter serves. The call is rate-limited per arbiter.

Exit status:
  0   valid: prints `valid`
  1   invalid (free key, an earlier holder's token, another epoch): prints `invalid`
  64  bad KEY, or no token in HOLDFAST_TOKEN or on standard input
  69  the arbiter is unreachable, sealed, not serving, or rate-limited this call
  77  the credentials were refused";

#[derive(clap::Args)]
pub struct ValidateArgs {
    /// The key, as NAMESPACE/KEY.
    key: String,
}

/// The presented token: HOLDFAST_TOKEN, else the first line of stdin.
/// Errors never include the value.
fn presented() -> Result<u64, String> {
    let (text, from) = match std::env::var("HOLDFAST_TOKEN") {
        Ok(v) => (v, "HOLDFAST_TOKEN"),
        Err(std::env::VarError::NotUnicode(_)) => return Err("HOLDFAST_TOKEN is not a decimal token".into()),
        Err(std::env::VarError::NotPresent) => {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).map_err(|e| format!("cannot read the token from standard input: {e}"))?;
            (line, "standard input")
        }
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("no token in {from}; set HOLDFAST_TOKEN or pipe the token on standard input (never pass it as an argument)"));
    }
    text.parse::<u64>().map_err(|_| format!("the value in {from} is not a decimal token"))
}

pub async fn run(conn: &ConnArgs, args: ValidateArgs) -> u8 {
    let key = match LockKey::parse(&args.key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::USAGE;
        }
    };
    let value = match presented() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::USAGE;
        }
    };
    // A value no arbiter could have minted is no holder's token.
    let Ok(token) = Token::from_wire(value) else {
        println!("invalid");
        return INVALID_TOKEN;
    };
    let client = match conn.connect().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.validate_token(&key, token).await {
        Ok(true) => {
            println!("valid");
            exit::OK
        }
        Ok(false) => {
            println!("invalid");
            INVALID_TOKEN
        }
        Err(e) => conn::report(&e),
    }
}
