//! Accepting the `:authority` the kubelet's registration client sends.
//!
//! **Why this exists.** The kubelet's plugin watcher dials the registration socket with
//! the bare socket path and a custom unix dialer, without `grpc.WithAuthority`
//! (`pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`, `dial`). grpc-go
//! then sends the URL-escaped path as the HTTP/2 `:authority`
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F…-reg.sock`). h2, under tonic, checks
//! `:authority` as an RFC 3986 authority, where `%` outside the userinfo is invalid, and
//! resets the stream with `PROTOCOL_ERROR`; the kubelet logs `RegisterPlugin error …
//! PROTOCOL_ERROR` and retries forever. Kubernetes fixed the same problem for the CSI and
//! device-plugin clients by sending `localhost` (kubernetes/kubernetes#108254, #109081,
//! PR #112597) but not for this dial; h2 has refused to relax the check
//! (hyperium/h2#487 open, grpc/grpc-rust#243, hyperium/hyper#3750).
//!
//! **What it does.** [`AuthorityFix`] wraps each accepted registration connection. On the
//! bytes the kubelet sends it rewrites only HTTP/2 header blocks: it decodes each block
//! with its own HPACK decoder (so the kubelet's dynamic table is tracked on our side),
//! replaces an `:authority` that h2 would refuse with `localhost` (what grpc-go itself
//! sends for `unix:` targets), and re-encodes the block as literals that never touch the
//! dynamic table, so h2's decoder and ours never need to agree on table state. Every other
//! frame, and everything the server sends back, passes through untouched. A valid
//! authority (a future kubelet that sends `localhost`) is kept as it is.
//!
//! The registration service is two small unary calls, so the extra decode costs nothing
//! that matters; the DRA service socket is dialled as `unix:` + path, which yields a valid
//! authority, and is served without this wrapper.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4), passed through verbatim.
const PREFACE_LEN: usize = 24;
/// Size of an HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;
/// `SETTINGS_MAX_FRAME_SIZE` every peer accepts; h2 (under tonic) keeps this default, and
/// re-encoded header blocks are split into frames no larger.
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// The largest frame we buffer before giving up: h2's own `max_frame_size` ceiling.
const MAX_ACCEPTED_FRAME: usize = 16_777_215;
/// The largest header block we reassemble from CONTINUATION frames (h2's default
/// `max_header_list_size` is 16 MiB; a registration request is a few hundred bytes).
const MAX_HEADER_BLOCK: usize = 1 << 20;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// The authority put in place of one h2 refuses.
pub const REPLACEMENT_AUTHORITY: &str = "localhost";

/// Why a connection's header blocks could not be rewritten. The connection is closed: a
/// peer whose header blocks cannot be decoded would be refused by h2 as well.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// HPACK decoding failed.
    #[error("cannot decode an HTTP/2 header block: {0:?}")]
    Hpack(loona_hpack::decoder::DecoderError),
    /// A HEADERS frame's padding or priority fields do not fit its payload.
    #[error("malformed HTTP/2 HEADERS frame on stream {stream}")]
    MalformedHeaders {
        /// The stream id.
        stream: u32,
    },
    /// A header block was interrupted by another frame, or continued on another stream.
    #[error(
        "HTTP/2 header block of stream {stream} interrupted by a frame of type {frame_type:#x}"
    )]
    Interrupted {
        /// The stream whose block was open.
        stream: u32,
        /// The frame that came instead of its CONTINUATION.
        frame_type: u8,
    },
    /// A frame or header block larger than we buffer.
    #[error("HTTP/2 frame or header block of {len} bytes is larger than accepted")]
    TooLarge {
        /// Its length.
        len: usize,
    },
}

impl From<RewriteError> for io::Error {
    fn from(e: RewriteError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// True when h2 accepts `value` as `:authority` (the same parse it applies).
pub fn is_acceptable(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A header block whose CONTINUATION frames are still to come.
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The sans-I/O rewriter of the client-to-server byte stream of one connection.
pub struct Rewriter {
    preface_left: usize,
    decoder: loona_hpack::Decoder<'static>,
    open: Option<OpenBlock>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A rewriter for a new connection (expects the client preface first).
    pub fn new() -> Self {
        Self {
            preface_left: PREFACE_LEN,
            decoder: loona_hpack::Decoder::new(),
            open: None,
        }
    }

    /// Moves every complete unit (preface bytes, whole frames) from `input` to `output`,
    /// rewriting header blocks; an incomplete frame stays in `input` for the next call.
    pub fn process(
        &mut self,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> Result<(), RewriteError> {
        if self.preface_left > 0 {
            let n = self.preface_left.min(input.len());
            output.extend_from_slice(&input.split_to(n));
            self.preface_left -= n;
            if self.preface_left > 0 {
                return Ok(());
            }
        }
        while input.len() >= FRAME_HEADER_LEN {
            let len =
                usize::from(input[0]) << 16 | usize::from(input[1]) << 8 | usize::from(input[2]);
            if len > MAX_ACCEPTED_FRAME {
                return Err(RewriteError::TooLarge { len });
            }
            if input.len() < FRAME_HEADER_LEN + len {
                input.reserve(FRAME_HEADER_LEN + len - input.len());
                return Ok(());
            }
            let header = input.split_to(FRAME_HEADER_LEN);
            let payload = input.split_to(len);
            let (frame_type, flags) = (header[3], header[4]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            match (frame_type, self.open.as_mut()) {
                (TYPE_HEADERS, None) => self.headers(stream, flags, &payload, output)?,
                (TYPE_CONTINUATION, Some(open)) if open.stream == stream => {
                    open.fragment.extend_from_slice(&payload);
                    if open.fragment.len() > MAX_HEADER_BLOCK {
                        return Err(RewriteError::TooLarge {
                            len: open.fragment.len(),
                        });
                    }
                    if flags & FLAG_END_HEADERS != 0
                        && let Some(block) = self.open.take()
                    {
                        self.finish(block, output)?;
                    }
                }
                (_, Some(open)) => {
                    return Err(RewriteError::Interrupted {
                        stream: open.stream,
                        frame_type,
                    });
                }
                (_, None) => {
                    output.extend_from_slice(&header);
                    output.extend_from_slice(&payload);
                }
            }
        }
        Ok(())
    }

    fn headers(
        &mut self,
        stream: u32,
        flags: u8,
        payload: &[u8],
        output: &mut BytesMut,
    ) -> Result<(), RewriteError> {
        let malformed = || RewriteError::MalformedHeaders { stream };
        let mut body = payload;
        let mut pad = 0usize;
        if flags & FLAG_PADDED != 0 {
            let (&n, rest) = body.split_first().ok_or_else(malformed)?;
            pad = usize::from(n);
            body = rest;
        }
        let mut priority = None;
        if flags & FLAG_PRIORITY != 0 {
            let (p, rest) = body.split_first_chunk::<5>().ok_or_else(malformed)?;
            priority = Some(*p);
            body = rest;
        }
        let fragment = body
            .get(..body.len().checked_sub(pad).ok_or_else(malformed)?)
            .ok_or_else(malformed)?;
        let block = OpenBlock {
            stream,
            end_stream: flags & FLAG_END_STREAM != 0,
            priority,
            fragment: fragment.to_vec(),
        };
        if flags & FLAG_END_HEADERS != 0 {
            self.finish(block, output)
        } else {
            self.open = Some(block);
            Ok(())
        }
    }

    fn finish(&mut self, block: OpenBlock, output: &mut BytesMut) -> Result<(), RewriteError> {
        let mut encoded = Vec::with_capacity(block.fragment.len() + 16);
        if let Some(p) = block.priority {
            encoded.extend_from_slice(&p);
        }
        let mut replaced = false;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                let value: &[u8] = if name.as_ref() == b":authority" && !is_acceptable(&value) {
                    replaced = true;
                    REPLACEMENT_AUTHORITY.as_bytes()
                } else {
                    &value
                };
                encode_literal(&name, value, &mut encoded);
            })
            .map_err(RewriteError::Hpack)?;
        if replaced {
            tracing::debug!(
                stream = block.stream,
                "replaced an :authority h2 would refuse"
            );
        }
        let mut flags = FLAG_END_HEADERS;
        if block.end_stream {
            flags |= FLAG_END_STREAM;
        }
        if block.priority.is_some() {
            flags |= FLAG_PRIORITY;
        }
        let mut chunks = encoded.chunks(MAX_FRAME_PAYLOAD).peekable();
        let mut frame_type = TYPE_HEADERS;
        let mut first_flags = flags & !FLAG_END_HEADERS;
        // An empty block (never sent in practice) still needs its one HEADERS frame.
        if chunks.peek().is_none() {
            write_frame(output, TYPE_HEADERS, flags, block.stream, &[]);
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let f = if last {
                first_flags | FLAG_END_HEADERS
            } else {
                first_flags
            };
            write_frame(output, frame_type, f, block.stream, chunk);
            frame_type = TYPE_CONTINUATION;
            // END_STREAM and PRIORITY belong to the HEADERS frame only.
            first_flags = 0;
        }
        Ok(())
    }
}

/// "Literal Header Field without Indexing — New Name" (RFC 7541 §6.2.2), raw strings.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

/// A string literal without Huffman coding (RFC 7541 §5.2).
fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_integer(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// An integer with an `n`-bit prefix (RFC 7541 §5.1).
fn encode_integer(mut value: usize, prefix_bits: u8, first_byte_flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        // Fits the prefix: value < 2^7, so the cast cannot truncate.
        out.push(first_byte_flags | u8::try_from(value).unwrap_or(0));
        return;
    }
    out.push(first_byte_flags | u8::try_from(max).unwrap_or(0));
    value -= max;
    while value >= 128 {
        out.push(u8::try_from(value % 128).unwrap_or(0) | 0x80);
        value /= 128;
    }
    out.push(u8::try_from(value).unwrap_or(0));
}

fn write_frame(out: &mut BytesMut, frame_type: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(frame_type);
    out.put_u8(flags);
    out.put_u32(stream & 0x7fff_ffff);
    out.put_slice(payload);
}

/// A connection whose incoming header blocks go through a [`Rewriter`]; writes pass
/// straight to the inner stream.
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    raw: BytesMut,
    ready: BytesMut,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    /// Wraps an accepted connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
            raw: BytesMut::with_capacity(4096),
            ready: BytesMut::with_capacity(4096),
            eof: false,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Whatever is left in `raw` is an incomplete frame; h2 sees the EOF.
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.eof = true;
                continue;
            }
            this.raw.extend_from_slice(read.filled());
            this.rewriter.process(&mut this.raw, &mut this.ready)?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
