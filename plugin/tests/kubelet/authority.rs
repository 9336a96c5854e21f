//! The kubelet's registration client sends the escaped socket path as `:authority`
//! (see `kubelet/authority.rs`). tonic's own client cannot send such a value, so these
//! tests speak HTTP/2 by hand over the socket, as grpc-go does.

use std::path::Path;

use prost::Message;
use tessera_plugin::kubelet::proto::registration::PluginInfo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

use crate::common::{DRIVER, FakeDriver, Running, WAIT};

/// What grpc-go puts in `:authority` when dialled with a bare socket path.
fn escaped(path: &Path) -> String {
    path.to_str().unwrap().replace('/', "%2F")
}

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], frame_type, flags];
    out.extend(stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// What one unary call got back.
#[derive(Debug, Default)]
struct Answer {
    headers: Vec<(String, String)>,
    data: Vec<u8>,
    reset: Option<u32>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One unary gRPC call with an empty request message and the given `:authority`.
async fn call(socket: &Path, path: &str, authority: &str) -> Answer {
    let mut conn = UnixStream::connect(socket).await.unwrap();
    let mut encoder = loona_hpack::Encoder::new();
    let block = encoder.encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", path.as_bytes()),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    conn.write_all(&out).await.unwrap();

    let mut decoder = loona_hpack::Decoder::new();
    let mut answer = Answer::default();
    let read = async {
        loop {
            let mut head = [0u8; 9];
            if conn.read_exact(&mut head).await.is_err() {
                return;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload).await.unwrap();
            let (t, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            match (t, stream) {
                // The server's SETTINGS: acknowledge, as every client must.
                (0x4, 0) if flags & 0x1 == 0 => {
                    conn.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap();
                }
                (0x1, 1) => {
                    for (n, v) in decoder.decode(&payload).unwrap() {
                        answer
                            .headers
                            .push((String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()));
                    }
                    if flags & 0x1 != 0 {
                        return;
                    }
                }
                (0x0, 1) => answer.data.extend_from_slice(&payload),
                (0x3, 1) => {
                    answer.reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                    return;
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(WAIT, read).await.unwrap();
    answer
}

#[tokio::test]
async fn get_info_answers_a_client_that_sends_the_escaped_socket_path_as_authority() {
    let running = Running::start(FakeDriver::default()).await;
    let socket = running.server.registration_socket().to_path_buf();

    let answer = call(
        &socket,
        "/pluginregistration.Registration/GetInfo",
        &escaped(&socket),
    )
    .await;

    assert_eq!(answer.reset, None, "{answer:?}");
    assert_eq!(answer.header(":status"), Some("200"), "{answer:?}");
    assert_eq!(answer.header("grpc-status"), Some("0"), "{answer:?}");
    // A gRPC message: flag byte, 4-byte length, the PluginInfo.
    let info = PluginInfo::decode(&answer.data[5..]).unwrap();
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.r#type, "DRAPlugin");
    running.shutdown().await;
}

#[tokio::test]
async fn a_valid_authority_still_works_and_the_dra_socket_shows_what_h2_alone_does() {
    let running = Running::start(FakeDriver::default()).await;
    let registration = running.server.registration_socket().to_path_buf();
    let dra = running.server.dra_socket().to_path_buf();

    let ok = call(
        &registration,
        "/pluginregistration.Registration/GetInfo",
        "localhost",
    )
    .await;
    // The DRA socket is served without the rewrite (the kubelet dials it as `unix:` +
    // path, which yields a valid authority): an escaped path there is refused by h2. This
    // is the behaviour the registration socket must not have.
    let refused = call(&dra, "/v1.DRAPlugin/NodePrepareResources", &escaped(&dra)).await;

    assert_eq!(ok.header("grpc-status"), Some("0"), "{ok:?}");
    assert_eq!(
        refused.reset,
        Some(0x1),
        "PROTOCOL_ERROR expected: {refused:?}"
    );
    running.shutdown().await;
}
