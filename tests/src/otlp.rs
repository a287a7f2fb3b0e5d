//! The collector side of span export: real OTLP receivers on 127.0.0.1
//! (OTLP/HTTP with protobuf bodies, and OTLP/gRPC), keeping every request
//! they were sent, and helpers that read and search what arrived.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One export request as it arrived.
#[derive(Clone)]
pub struct Received {
    /// The request body exactly as sent (OTLP/HTTP), or the decoded message
    /// encoded again (gRPC: the receiver sees it decoded).
    pub raw: Vec<u8>,
    pub request: ExportTraceServiceRequest,
}

#[derive(Default)]
struct Store {
    received: Mutex<Vec<Received>>,
    /// Problems with requests (wrong path, content type, undecodable body).
    problems: Mutex<Vec<String>>,
    connections: AtomicUsize,
}

/// A running receiver, on a runtime of its own: it keeps answering while
/// the test's thread blocks (stopping an arbiter waits for its final export).
/// Stops when dropped.
pub struct OtlpReceiver {
    pub port: u16,
    store: Arc<Store>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(r) = self.runtime.take() {
            r.shutdown_background();
        }
    }
}

/// The receiver's runtime and its (non-blocking) listener on 127.0.0.1.
fn receiver_runtime() -> (tokio::runtime::Runtime, std::net::TcpListener, u16) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("receiver runtime");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    listener.set_nonblocking(true).expect("non-blocking listener");
    let port = listener.local_addr().expect("addr").port();
    (runtime, listener, port)
}

impl OtlpReceiver {
    /// OTLP/HTTP: `POST /v1/traces` with an `application/x-protobuf` body.
    pub fn http() -> Self {
        let (runtime, listener, port) = receiver_runtime();
        let store = Arc::new(Store::default());
        runtime.spawn({
            let store = store.clone();
            async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    store.connections.fetch_add(1, Ordering::SeqCst);
                    let store = store.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| http_export(store.clone(), req));
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                    });
                }
            }
        });
        OtlpReceiver { port, store, runtime: Some(runtime) }
    }

    /// OTLP/gRPC: the `opentelemetry.proto.collector.trace.v1.TraceService`.
    pub fn grpc() -> Self {
        let (runtime, listener, port) = receiver_runtime();
        let store = Arc::new(Store::default());
        runtime.spawn({
            let store = store.clone();
            async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let counted = {
                    let store = store.clone();
                    tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), move |s| {
                        store.connections.fetch_add(1, Ordering::SeqCst);
                        s
                    })
                };
                let server = tonic::transport::Server::builder().add_service(TraceServiceServer::new(GrpcReceiver(store.clone())));
                let _ = server.serve_with_incoming(counted).await;
            }
        });
        OtlpReceiver { port, store, runtime: Some(runtime) }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far; panics if any was malformed.
    pub fn received(&self) -> Vec<Received> {
        let problems = self.store.problems.lock().unwrap().clone();
        assert!(problems.is_empty(), "the receiver refused requests: {problems:?}");
        self.store.received.lock().unwrap().clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.store.connections.load(Ordering::SeqCst)
    }
}

async fn http_export(
    store: Arc<Store>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<http_body_util::Full<hyper::body::Bytes>>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let reply = |status: u16, body: Vec<u8>| {
        Ok(hyper::Response::builder()
            .status(status)
            .header("content-type", "application/x-protobuf")
            .body(http_body_util::Full::new(body.into()))
            .unwrap())
    };
    let mut problem = None;
    if req.method() != hyper::Method::POST || req.uri().path() != "/v1/traces" {
        problem = Some(format!("{} {}: not an OTLP/HTTP traces request", req.method(), req.uri()));
    }
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    if header("content-type").as_deref() != Some("application/x-protobuf") {
        problem = Some(format!("content-type {:?}, not application/x-protobuf", header("content-type")));
    }
    if let Some(encoding) = header("content-encoding") {
        // Compressed bodies could hide a token from the byte search.
        problem = Some(format!("content-encoding {encoding}: the test reads uncompressed bodies only"));
    }
    let raw = match req.into_body().collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(e) => {
            problem = Some(format!("reading the body: {e}"));
            Vec::new()
        }
    };
    if let Some(p) = problem {
        store.problems.lock().unwrap().push(p);
        return reply(400, Vec::new());
    }
    match ExportTraceServiceRequest::decode(raw.as_slice()) {
        Ok(request) => {
            store.received.lock().unwrap().push(Received { raw, request });
            reply(200, ExportTraceServiceResponse::default().encode_to_vec())
        }
        Err(e) => {
            store.problems.lock().unwrap().push(format!("undecodable ExportTraceServiceRequest: {e}"));
            reply(400, Vec::new())
        }
    }
}

struct GrpcReceiver(Arc<Store>);

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        self.0.received.lock().unwrap().push(Received { raw: request.encode_to_vec(), request });
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// One exported span, flattened for assertions.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub span_id: Vec<u8>,
    pub parent_span_id: Vec<u8>,
    /// Attribute values as text (strings as they are, numbers in decimal).
    pub attributes: BTreeMap<String, String>,
    /// `service.name` of the resource that exported it.
    pub service: String,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn flat(attrs: &[KeyValue]) -> BTreeMap<String, String> {
    attrs.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

/// Every span in every request.
pub fn spans(received: &[Received]) -> Vec<Span> {
    let mut out = Vec::new();
    for r in received {
        for rs in &r.request.resource_spans {
            let resource = rs.resource.as_ref().map(|r| flat(&r.attributes)).unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    out.push(Span {
                        name: s.name.clone(),
                        span_id: s.span_id.clone(),
                        parent_span_id: s.parent_span_id.clone(),
                        attributes: flat(&s.attributes),
                        service: service.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Every attribute value anywhere in a request: resource, scope, span,
/// event and link attributes, nested arrays and maps.
fn all_values(request: &ExportTraceServiceRequest) -> Vec<AnyValue> {
    fn walk(v: &AnyValue, out: &mut Vec<AnyValue>) {
        out.push(v.clone());
        match &v.value {
            Some(any_value::Value::ArrayValue(a)) => a.values.iter().for_each(|v| walk(v, out)),
            Some(any_value::Value::KvlistValue(l)) => l.values.iter().filter_map(|kv| kv.value.as_ref()).for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let mut add = |attrs: &[KeyValue]| attrs.iter().filter_map(|kv| kv.value.as_ref()).for_each(|v| walk(v, &mut out));
    for rs in &request.resource_spans {
        if let Some(r) = &rs.resource {
            add(&r.attributes);
        }
        for ss in &rs.scope_spans {
            if let Some(scope) = &ss.scope {
                add(&scope.attributes);
            }
            for s in &ss.spans {
                add(&s.attributes);
                s.events.iter().for_each(|e| add(&e.attributes));
                s.links.iter().for_each(|l| add(&l.attributes));
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Panics if any token appears in any request: in the raw bytes (as
/// decimal, hex, or 8 big- or little-endian bytes), in any decoded string,
/// or as any integer, float or bytes attribute value.
pub fn assert_no_tokens(received: &[Received], tokens: &[u64]) {
    for (i, r) in received.iter().enumerate() {
        // Debug shows every string field (names, attribute keys and values,
        // status messages, scope names) and every number in decimal.
        let decoded = format!("{:?}", r.request);
        for &t in tokens {
            let textual = [t.to_string(), format!("{t:x}"), format!("{t:X}"), format!("{t:#x}")];
            let binary = [t.to_be_bytes(), t.to_le_bytes()];
            for form in &textual {
                assert!(!contains(&r.raw, form.as_bytes()), "request {i}: a token's text appears in the exported bytes");
                assert!(!decoded.contains(form.as_str()), "request {i}: a token's text appears in the decoded request");
            }
            for form in &binary {
                assert!(!contains(&r.raw, form), "request {i}: a token's 8 bytes appear in the exported bytes");
            }
            for v in all_values(&r.request) {
                match &v.value {
                    Some(any_value::Value::IntValue(n)) => assert_ne!(*n as u64, t, "request {i}: an integer attribute is a token"),
                    Some(any_value::Value::DoubleValue(d)) => assert_ne!(*d, t as f64, "request {i}: a float attribute is a token"),
                    Some(any_value::Value::BytesValue(b)) => {
                        assert!(!binary.iter().any(|f| contains(b, f)), "request {i}: a bytes attribute holds a token")
                    }
                    _ => {}
                }
            }
        }
    }
}
