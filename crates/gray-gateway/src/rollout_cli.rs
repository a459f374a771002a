//! `gray-gateway rollout status|start|pause|resume|promote|abort --admin ADDR [SERVICE]`:
//! the admin API's rollout endpoints, over one HTTP/1.1 connection (std TCP). An admin with
//! an `admin_token` gets it as a bearer token from `--token-file PATH` or the environment
//! variable `GRAY_ADMIN_TOKEN` (never from the command line, which other users can list).

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

pub(crate) const USAGE: &str = "       gray-gateway rollout status|start|pause|resume|promote|abort --admin <ADDR> [--json] [--token-file <PATH>] <SERVICE>
                                            (status without a service: every rollout; the token
                                            also from $GRAY_ADMIN_TOKEN)";

/// Runs the command in `args` (after `rollout`); returns the exit status.
pub(crate) fn main(args: impl Iterator<Item = String>) -> i32 {
    let (mut command, mut admin, mut service, mut json) = (None, None, None, false);
    let mut token_file = None;
    let mut args = args;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--admin" => admin = args.next(),
            "--token-file" => match args.next() {
                Some(path) => token_file = Some(path),
                None => return usage("--token-file needs a path"),
            },
            "--json" => json = true,
            _ if arg.starts_with('-') => return usage(&format!("unknown argument `{arg}`")),
            _ if command.is_none() => command = Some(arg),
            _ if service.is_none() => service = Some(arg),
            _ => return usage(&format!("unexpected argument `{arg}`")),
        }
    }
    let (Some(command), Some(admin)) = (command, admin) else {
        return usage("a command and --admin ADDR are required");
    };
    let (method, path) = match (command.as_str(), &service) {
        ("status", None) => ("GET", "/rollouts".to_owned()),
        ("status", Some(s)) => ("GET", format!("/rollouts/{s}")),
        ("start", Some(s)) => ("POST", format!("/rollouts/{s}")),
        ("pause" | "resume" | "promote" | "abort", Some(s)) => {
            ("POST", format!("/rollouts/{s}/{command}"))
        }
        ("start" | "pause" | "resume" | "promote" | "abort", None) => {
            return usage(&format!("`{command}` needs a service"));
        }
        _ => return usage(&format!("unknown command `{command}`")),
    };
    let token = match token_file {
        Some(path) => match std::fs::read_to_string(&path) {
            Ok(text) => Some(text.trim().to_owned()),
            Err(e) => {
                eprintln!("error: --token-file {path}: {e}");
                return 1;
            }
        },
        None => std::env::var("GRAY_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
    };
    if token
        .as_deref()
        .is_some_and(|t| t.chars().any(|c| !c.is_ascii_graphic()))
    {
        eprintln!("error: the admin token has characters a header cannot carry");
        return 1;
    }
    let (status, body) = match request(&admin, method, &path, token.as_deref()) {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("error: {method} http://{admin}{path}: {e}");
            return 1;
        }
    };
    let value: serde_json::Value = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
    if !(200..300).contains(&status) {
        let reason = value["error"].as_str().unwrap_or(body.as_str());
        eprintln!("error: {status}: {reason}");
        return 1;
    }
    if json {
        println!("{body}");
    } else if let Some(all) = value["rollouts"].as_object() {
        for view in all.values() {
            println!("{}", summary(view));
        }
    } else {
        println!("{}", summary(&value));
    }
    0
}

fn usage(message: &str) -> i32 {
    eprintln!("error: {message}\nusage:\n{USAGE}");
    2
}

/// `orders: step, weight 5 % (step 2 of 6, rule canary); last: advance`.
fn summary(v: &serde_json::Value) -> String {
    let steps = v["steps"].as_array().map_or(0, Vec::len);
    let step = v["step"].as_u64().map_or_else(
        || "no step".to_owned(),
        |s| format!("step {} of {steps}", s + 1),
    );
    let last = match v["last_transition"]["reason"]["kind"].as_str() {
        Some(kind) => format!("; last transition: {kind}"),
        None => String::new(),
    };
    // what this gateway is to the rollout: its leader or not, cut off from the store
    let mut role = match v["leader"].as_bool() {
        Some(true) => "; this gateway leads".to_owned(),
        Some(false) => "; another gateway leads".to_owned(),
        None => String::new(),
    };
    if v["cut_off"].as_bool() == Some(true) {
        role.push_str("; cut off from the store");
    }
    if let Some(reason) = v["config_skew"]["reason"].as_str() {
        role.push_str(
            "; this gateway's configuration of the rollout does not fit the stored state: ",
        );
        role.push_str(reason);
    }
    format!(
        "{}: {}, weight {} % ({step}, rule {}){last}{role}",
        v["service"].as_str().unwrap_or("?"),
        v["phase"].as_str().unwrap_or("?"),
        v["weight"]
            .as_f64()
            .map_or_else(|| "?".to_owned(), |w| w.to_string()),
        v["rule"].as_str().unwrap_or("?"),
    )
}

/// One request, `Connection: close`; the status and the body.
fn request(
    admin: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(admin)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {admin}\r\n{authorization}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no complete response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    Ok((
        status,
        if chunked {
            unchunk(body)
        } else {
            body.to_owned()
        },
    ))
}

/// The body of a chunked response.
fn unchunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
