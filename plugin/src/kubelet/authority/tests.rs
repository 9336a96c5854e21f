use bytes::BytesMut;

use super::*;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What grpc-go sends for the kubelet's registration dial (the escaped socket path).
const ESCAPED: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.tessera.dev-reg.sock";

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    write_frame(&mut out, frame_type, flags, stream, payload);
    out.to_vec()
}

/// "Literal with incremental indexing, indexed name" (RFC 7541 §6.2.1): how grpc-go's
/// encoder sends a new `:authority` (static index 1) or `:path` (static index 4).
fn indexed_name_literal(index: u8, value: &str) -> Vec<u8> {
    let mut out = vec![0x40 | index];
    encode_string(value.as_bytes(), &mut out);
    out
}

/// A gRPC request's header block as grpc-go first sends it; the authority is added to the
/// dynamic table (index 62), so a second request can send it as the single byte 0xbe.
fn first_request(authority: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    block.extend(indexed_name_literal(
        4,
        "/pluginregistration.Registration/GetInfo",
    ));
    block.extend(indexed_name_literal(1, authority));
    let mut te = Vec::new();
    encode_literal(b"te", b"trailers", &mut te);
    block.extend(te);
    block
}

/// Runs the rewriter over `bytes` fed in pieces of `step`, returning all output.
fn rewrite(bytes: &[u8], step: usize) -> Result<Vec<u8>, RewriteError> {
    let mut rewriter = Rewriter::new();
    let (mut input, mut output) = (BytesMut::new(), BytesMut::new());
    for piece in bytes.chunks(step) {
        input.extend_from_slice(piece);
        rewriter.process(&mut input, &mut output)?;
    }
    assert!(input.is_empty(), "left unprocessed: {input:?}");
    Ok(output.to_vec())
}

/// Splits a byte stream after the preface into (type, flags, stream, payload) frames.
fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert_eq!(&bytes[..24], PREFACE);
    let mut rest = &bytes[24..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        out.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
        rest = &rest[9 + len..];
    }
    out
}

/// Decodes every header block of a rewritten stream with one decoder, as h2 would.
fn decoded_blocks(bytes: &[u8]) -> Vec<Vec<(String, String)>> {
    let mut decoder = loona_hpack::Decoder::new();
    let mut blocks = Vec::new();
    let mut open: Option<Vec<u8>> = None;
    for (t, flags, _, payload) in frames(bytes) {
        match t {
            TYPE_HEADERS => {
                assert_eq!(flags & FLAG_PADDED, 0, "padding is dropped");
                let skip = if flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
                open = Some(payload[skip..].to_vec());
            }
            TYPE_CONTINUATION => open
                .as_mut()
                .expect("CONTINUATION without HEADERS")
                .extend_from_slice(&payload),
            _ => continue,
        }
        if flags & FLAG_END_HEADERS != 0 {
            let block = open.take().unwrap();
            let headers = decoder.decode(&block).unwrap();
            blocks.push(
                headers
                    .into_iter()
                    .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                    .collect(),
            );
        }
    }
    blocks
}

fn authority(block: &[(String, String)]) -> &str {
    &block.iter().find(|(n, _)| n == ":authority").unwrap().1
}

#[test]
fn h2_refuses_the_escaped_socket_path_and_accepts_localhost() {
    assert!(!is_acceptable(ESCAPED.as_bytes()));
    assert!(!is_acceptable(b"/var/lib/kubelet/plugins_registry/x.sock"));
    assert!(is_acceptable(b"localhost"));
    assert!(is_acceptable(b"www.example.com:443"));
}

#[test]
fn the_kubelets_escaped_authority_becomes_localhost_also_when_indexed() {
    let mut stream = PREFACE.to_vec();
    stream.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    stream.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &first_request(ESCAPED),
    ));
    stream.extend(frame(0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0])); // DATA
    // The second call on the connection names the authority by its dynamic table index.
    let second = [0x83, 0x86, 0xbe];
    stream.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &second));

    let out = rewrite(&stream, stream.len()).unwrap();

    let blocks = decoded_blocks(&out);
    assert_eq!(blocks.len(), 2);
    assert_eq!(authority(&blocks[0]), "localhost");
    assert_eq!(authority(&blocks[1]), "localhost");
    assert!(blocks[0].contains(&(
        ":path".into(),
        "/pluginregistration.Registration/GetInfo".into()
    )));
    assert!(blocks[0].contains(&("te".into(), "trailers".into())));
    // Frames other than header blocks pass through byte for byte, in order.
    let f = frames(&out);
    assert_eq!(f[0], (0x4, 0, 0, vec![]));
    assert_eq!(f[2], (0x0, FLAG_END_STREAM, 1, vec![0, 0, 0, 0, 0]));
}

#[test]
fn a_valid_huffman_coded_authority_is_kept() {
    // RFC 7541 C.4.1: GET http://www.example.com/ with Huffman-coded strings.
    let block = [
        0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90,
        0xf4, 0xff,
    ];
    let mut stream = PREFACE.to_vec();
    stream.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        1,
        &block,
    ));

    let out = rewrite(&stream, stream.len()).unwrap();

    let blocks = decoded_blocks(&out);
    assert_eq!(authority(&blocks[0]), "www.example.com");
    assert_eq!(frames(&out)[0].1, FLAG_END_HEADERS | FLAG_END_STREAM);
}

#[test]
fn padding_priority_and_continuations_are_handled_and_flags_kept() {
    let block = first_request(ESCAPED);
    let (a, b) = block.split_at(10);
    let mut headers = vec![3u8]; // pad length
    headers.extend([0, 0, 0, 0, 16]); // priority: no dependency, weight 16
    headers.extend_from_slice(a);
    headers.extend([0, 0, 0]);
    let mut stream = PREFACE.to_vec();
    stream.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
        5,
        &headers,
    ));
    stream.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 5, b));

    // Fed one byte at a time, as a slow socket would deliver it.
    let out = rewrite(&stream, 1).unwrap();

    let f = frames(&out);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].1, FLAG_END_HEADERS | FLAG_END_STREAM | FLAG_PRIORITY);
    assert_eq!(&f[0].3[..5], &[0, 0, 0, 0, 16]);
    assert_eq!(authority(&decoded_blocks(&out)[0]), "localhost");
}

#[test]
fn a_block_larger_than_one_frame_is_split_into_continuations() {
    let mut block = first_request(ESCAPED);
    encode_literal(b"x-big", &vec![b'a'; 40_000], &mut block);
    let mut stream = PREFACE.to_vec();
    stream.extend(frame(
        TYPE_HEADERS,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        1,
        &block,
    ));

    let out = rewrite(&stream, 4096).unwrap();

    let f = frames(&out);
    assert_eq!(f.len(), 3);
    assert!(f.iter().all(|(_, _, _, p)| p.len() <= MAX_FRAME_PAYLOAD));
    assert_eq!((f[0].0, f[0].1), (TYPE_HEADERS, FLAG_END_STREAM));
    assert_eq!((f[1].0, f[1].1), (TYPE_CONTINUATION, 0));
    assert_eq!((f[2].0, f[2].1), (TYPE_CONTINUATION, FLAG_END_HEADERS));
    let blocks = decoded_blocks(&out);
    assert_eq!(authority(&blocks[0]), "localhost");
    assert_eq!(
        blocks[0]
            .iter()
            .find(|(n, _)| n == "x-big")
            .unwrap()
            .1
            .len(),
        40_000
    );
}

#[test]
fn a_header_block_interrupted_by_another_frame_closes_the_connection() {
    let block = first_request(ESCAPED);
    let mut stream = PREFACE.to_vec();
    stream.extend(frame(TYPE_HEADERS, 0, 1, &block[..5]));
    stream.extend(frame(0x6, 0, 0, &[0; 8])); // PING

    let err = rewrite(&stream, stream.len()).unwrap_err();

    assert!(
        matches!(
            err,
            RewriteError::Interrupted {
                stream: 1,
                frame_type: 0x6
            }
        ),
        "{err:?}"
    );
}

#[test]
fn an_undecodable_block_is_an_error_not_a_pass_through() {
    let mut stream = PREFACE.to_vec();
    // Indexed field 70: beyond the static table with an empty dynamic table.
    stream.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x80 | 70]));

    assert!(matches!(
        rewrite(&stream, stream.len()),
        Err(RewriteError::Hpack(_))
    ));
}

#[test]
fn integers_use_the_prefix_then_continuation_bytes() {
    // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
    let mut out = Vec::new();
    encode_integer(1337, 5, 0, &mut out);
    assert_eq!(out, [31, 154, 10]);
    let mut out = Vec::new();
    encode_integer(10, 5, 0, &mut out);
    assert_eq!(out, [10]);
}
