//! Span export over OTLP (OpenTelemetry), off unless `[tracing]
//! otlp_endpoint` is set.
//!
//! What is exported: the `tracing` spans of this crate (target
//! `holdfast_arbiter`) at INFO and above — one per lock.v1 call (named
//! `lock.v1.Lock/<Method>`) and one per grant or release transaction — with
//! the fields the call sites give them: namespace, key, session, outcome.
//! Spans and events of other crates (tonic, h2, etcd-client, the exporter
//! itself) never reach the exporter.
//!
//! Tokens are capabilities: no span field holds a token, a revision (half of
//! one), or a request message (`ReleaseRequest` carries a token). The
//! `observability` end-to-end test decodes every exported request and
//! searches it for every issued token.
//!
//! Spans leave in batches from the SDK's background thread. gRPC goes
//! through tonic (the one tonic of the workspace); http/protobuf through a
//! hyper client whose requests run on the arbiter's runtime (the OTLP crate's
//! own clients would add reqwest). [`Telemetry::shutdown`] flushes.

use crate::config::{OtlpProtocol, TracingConfig};
use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use std::time::Duration;
use tracing_subscriber::Layer;

/// The running exporter. Keep it until the runtime has finished, then call
/// [`Telemetry::shutdown`].
pub struct Telemetry {
    provider: SdkTracerProvider,
}

/// The target whose spans are exported.
pub const TARGET: &str = "holdfast_arbiter";

impl Telemetry {
    /// Builds the exporter, or `None` when tracing export is off. Must run
    /// inside the Tokio runtime that will carry the exports.
    pub fn start(config: &TracingConfig, cluster: &str) -> anyhow::Result<Option<Telemetry>> {
        let Some(endpoint) = &config.otlp_endpoint else { return Ok(None) };
        let exporter = match config.protocol {
            OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .with_timeout(config.timeout)
                .build(),
            OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(RuntimeHttpClient::new(config.timeout)?)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(traces_url(endpoint))
                .with_timeout(config.timeout)
                .build(),
        }
        .with_context(|| format!("tracing.otlp_endpoint {endpoint}: cannot build the OTLP exporter"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new("holdfast.cluster", cluster.to_string()))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sampling_ratio))))
            .with_resource(resource)
            .build();
        Ok(Some(Telemetry { provider }))
    }

    /// The subscriber layer that turns this crate's spans into OTLP spans.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let tracer = self.provider.tracer("holdfast-arbiter");
        let only_ours = tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::INFO);
        tracing_opentelemetry::layer().with_tracer(tracer).with_filter(only_ours)
    }

    /// Exports what is still queued and stops the exporter. Call it while the
    /// runtime still exists (its exports run there), before exiting.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(error = %e, "tracing export: spans still queued at shutdown may be lost");
        }
    }
}

/// `http://host:4318` → `http://host:4318/v1/traces`; a URL with a path is
/// taken as the full traces URL.
fn traces_url(endpoint: &str) -> String {
    match endpoint.parse::<hyper::Uri>() {
        Ok(uri) if matches!(uri.path(), "" | "/") => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_string(),
    }
}

type HttpError = opentelemetry_http::HttpError;
type Body = http_body_util::Full<hyper::body::Bytes>;

/// Sends OTLP/HTTP requests on the runtime the exporter was built in. The
/// SDK's batch thread awaits the result; connections and timers live on
/// the runtime.
#[derive(Debug)]
struct RuntimeHttpClient {
    runtime: tokio::runtime::Handle,
    client: hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>,
    timeout: Duration,
}

/// Largest collector response read (collectors answer with a small
/// protobuf, usually empty).
const MAX_RESPONSE: usize = 1 << 20;

impl RuntimeHttpClient {
    fn new(timeout: Duration) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().context("the OTLP exporter must be built inside the runtime")?;
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Ok(RuntimeHttpClient { runtime, client, timeout })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RuntimeHttpClient {
    async fn send_bytes(&self, request: hyper::Request<hyper::body::Bytes>) -> Result<hyper::Response<hyper::body::Bytes>, HttpError> {
        use http_body_util::BodyExt;
        let (client, timeout) = (self.client.clone(), self.timeout);
        let (parts, body) = request.into_parts();
        let request = hyper::Request::from_parts(parts, Body::new(body));
        let exchange = async move {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = http_body_util::Limited::new(body, MAX_RESPONSE).collect().await?.to_bytes();
            Ok::<_, HttpError>(hyper::Response::from_parts(parts, body))
        };
        let task = self.runtime.spawn(async move {
            tokio::time::timeout(timeout, exchange).await.unwrap_or_else(|_| Err("the collector did not answer in time".into()))
        });
        task.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_to_a_base_url_only() {
        assert_eq!(traces_url("http://127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(traces_url("http://127.0.0.1:4318/"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/otlp/v1/traces"), "http://c:4318/otlp/v1/traces");
    }

    /// A collector stand-in: accepts one connection and returns the raw
    /// HTTP request it read.
    fn one_request(listener: std::net::TcpListener) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(n) = s.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse::<usize>().unwrap()));
                    if len.is_some_and(|len| body.len() >= len) {
                        break;
                    }
                }
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n");
            buf
        })
    }

    #[test]
    fn spans_of_this_crate_are_flushed_over_http_at_shutdown() {
        use tracing_subscriber::prelude::*;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let collector = one_request(listener);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let config = TracingConfig { otlp_endpoint: Some(endpoint), ..Default::default() };
        let telemetry = runtime.block_on(async { Telemetry::start(&config, "unit") }).unwrap().unwrap();
        let subscriber = tracing_subscriber::registry().with(telemetry.layer());
        tracing::subscriber::with_default(subscriber, || {
            let _ours = tracing::info_span!("ours", otel.name = "unit span").entered();
            let _theirs = tracing::info_span!(target: "somebody_else", "theirs").entered();
        });
        telemetry.shutdown();
        let request = String::from_utf8_lossy(&collector.join().unwrap()).to_string();
        assert!(request.starts_with("POST /v1/traces HTTP/1.1"), "{request}");
        assert!(request.contains("unit span"), "{request}");
        assert!(!request.contains("theirs"), "spans of other crates are not exported: {request}");
    }
}
