//! What the holdfast daemons (arbiter, controller, and the ones to come)
//! share. Today: the Prometheus text endpoint each serves on
//! `metrics_listen`.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use std::net::SocketAddr;

/// Serves `GET /metrics` (anything else: 404) over plain HTTP/1.1 on
/// `addr`, answering with `encode()` (Prometheus text format). Returns the
/// bound address (port 0 picks one).
pub async fn serve_metrics(addr: SocketAddr, encode: fn() -> String) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding metrics_listen {addr}: {e}; change metrics_listen or stop what uses the port"))?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| async move {
                    if req.uri().path() == "/metrics" {
                        Response::builder()
                            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                            .body(Full::new(Bytes::from(encode())))
                    } else {
                        Response::builder().status(StatusCode::NOT_FOUND).body(Full::new(Bytes::from_static(b"see /metrics\n")))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    Ok(local)
}
