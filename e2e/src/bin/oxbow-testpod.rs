//! `oxbow-testpod` — a tiny HTTP program the end-to-end tests run as a pod.
//!
//! `GET /healthz`, `GET /readyz`, `GET /whoami` (pod name and IP), and
//! `PUT|GET /files/<name>` to write and read files in its data directory (a volume).
//! `oxbow-testpod get <url>` is a client instead: one `GET http://host:port/path`
//! (the host by name or IP), the body on stdout, exit 0 on a 2xx answer, 1 otherwise
//! (refused, timed out after 5 s, or another status). Standard library only, so it
//! builds in seconds.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Args {
    listen: String,
    data_dir: PathBuf,
    ready_after: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut listen = None;
    let mut data_dir = PathBuf::from(".");
    let mut ready_after = Duration::ZERO;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(val()?),
            "--data-dir" => data_dir = PathBuf::from(val()?),
            "--ready-after" => {
                ready_after = Duration::from_secs_f64(
                    val()?.parse().map_err(|e| format!("--ready-after: {e}"))?,
                )
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let listen = listen.ok_or("--listen ADDR:PORT is required")?;
    Ok(Args {
        listen,
        data_dir,
        ready_after,
    })
}

/// `get <url>`: one HTTP/1.0 GET, the body to stdout; exit 0 only on a 2xx answer.
fn get(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs"))?;
    let (host_port, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr = std::net::ToSocketAddrs::to_socket_addrs(host_port)
        .map_err(|e| format!("{host_port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host_port}: no address"))?;
    let timeout = Duration::from_secs(5);
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
    write!(stream, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("{addr}: {e}"))?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('2') {
        Ok(body.to_string())
    } else {
        Err(format!(
            "{url}: {}",
            head.lines().next().unwrap_or("no answer")
        ))
    }
}

fn main() {
    oxbow_e2e::exit_on_termination();
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("get") {
        match argv.get(2).map(|u| get(u)) {
            Some(Ok(body)) => {
                print!("{body}");
                std::process::exit(0);
            }
            Some(Err(e)) => {
                eprintln!("oxbow-testpod get: {e}");
                std::process::exit(1);
            }
            None => {
                eprintln!("oxbow-testpod get: a URL is required");
                std::process::exit(2);
            }
        }
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("oxbow-testpod: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.data_dir) {
        eprintln!(
            "oxbow-testpod: failed to create {}: {e}",
            args.data_dir.display()
        );
        std::process::exit(1);
    }
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("oxbow-testpod: failed to listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    eprintln!(
        "oxbow-testpod listening on {} with data in {}",
        args.listen,
        args.data_dir.display()
    );
    let start = Instant::now();
    for stream in listener.incoming().flatten() {
        if let Err(e) = serve(stream, &args, start) {
            eprintln!("oxbow-testpod: request failed: {e}");
        }
    }
}

fn serve(mut stream: TcpStream, args: &Args, start: Instant) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let file = path
        .strip_prefix("/files/")
        .filter(|n| !n.is_empty() && !n.contains('/') && !n.contains(".."));
    let (code, out): (u16, Vec<u8>) = match (method, path, file) {
        ("GET", "/healthz", _) => (200, b"ok".to_vec()),
        ("GET", "/readyz", _) if start.elapsed() >= args.ready_after => (200, b"ready".to_vec()),
        ("GET", "/readyz", _) => (503, b"not ready yet".to_vec()),
        ("GET", "/whoami", _) => {
            let pod = std::env::var("HOSTNAME").unwrap_or_default();
            let ip = std::env::var("POD_IP").unwrap_or_default();
            (
                200,
                format!("{{\"pod\":\"{pod}\",\"ip\":\"{ip}\"}}").into_bytes(),
            )
        }
        ("PUT", _, Some(name)) => match std::fs::write(args.data_dir.join(name), &body) {
            Ok(()) => (201, b"written".to_vec()),
            Err(e) => (500, e.to_string().into_bytes()),
        },
        ("GET", _, Some(name)) => match std::fs::read(args.data_dir.join(name)) {
            Ok(b) => (200, b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (404, b"no such file".to_vec()),
            Err(e) => (500, e.to_string().into_bytes()),
        },
        _ => (404, b"not found".to_vec()),
    };
    let reason = match code {
        200 => "OK",
        201 => "Created",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Error",
    };
    write!(
        stream,
        "HTTP/1.1 {code} {reason}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        out.len()
    )?;
    stream.write_all(&out)?;
    stream.flush()
}
