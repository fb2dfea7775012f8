//! `oxbow-standin-worker` — stands in for the worker in operator tests: it accepts the
//! worker's command line, checks that its config file is a StreamApp manifest, and serves
//! `/healthz` and `/readyz` on `--listen` (default `$POD_IP:8080`). It processes nothing.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

fn main() {
    oxbow_e2e::exit_on_termination();
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(config) = flag("--config") {
        match std::fs::read_to_string(&config) {
            Ok(text) if text.contains("kind: StreamApp") => {}
            Ok(_) => {
                eprintln!("oxbow-standin-worker: {config} is not a StreamApp manifest");
                std::process::exit(2);
            }
            Err(e) => {
                eprintln!("oxbow-standin-worker: failed to read {config}: {e}");
                std::process::exit(2);
            }
        }
    }
    let listen = flag("--listen").unwrap_or_else(|| {
        format!(
            "{}:8080",
            std::env::var("POD_IP").unwrap_or_else(|_| "127.0.0.1".into())
        )
    });
    let listener = match TcpListener::bind(&listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("oxbow-standin-worker: failed to listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("oxbow-standin-worker listening on {listen}");
    for mut stream in listener.incoming().flatten() {
        let mut line = String::new();
        let _ = BufReader::new(&stream).read_line(&mut line);
        let path = line.split_whitespace().nth(1).unwrap_or("");
        let (code, body) = match path {
            "/healthz" | "/readyz" => ("200 OK", "ok"),
            _ => ("404 Not Found", "not found"),
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {code}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}
