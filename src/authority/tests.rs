//! The connection filter against real HPACK encoders: which header blocks are rewritten,
//! which pass through untouched, and what the server's decoder sees.

use super::*;

/// A client's header block, encoded by an HPACK encoder of the client's own.
fn client_block(encoder: &mut loona_hpack::Encoder<'static>, authority: &[u8]) -> Vec<u8> {
    encoder.encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/grpc.health.v1.Health/Check"),
        (b":authority", authority),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
    ])
}

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame_header(&mut out, payload.len(), frame_type, flags, stream);
    out.extend_from_slice(payload);
    out
}

/// Splits what the server reads into frames, and decodes its header blocks with a decoder of
/// the server's own: (type, flags, stream, headers or payload).
type Headers = Vec<(Vec<u8>, Vec<u8>)>;

fn server_view(bytes: &[u8]) -> Vec<(u8, u8, u32, Headers, Vec<u8>)> {
    assert!(bytes.starts_with(PREFACE));
    let mut rest = &bytes[PREFACE.len()..];
    let mut decoder = loona_hpack::Decoder::new();
    let mut frames = Vec::new();
    let mut block = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (t, f) = (rest[3], rest[4]);
        let s = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        let payload = rest[9..9 + len].to_vec();
        rest = &rest[9 + len..];
        let mut headers = Vec::new();
        if t == TYPE_HEADERS || t == TYPE_CONTINUATION {
            let skip = if t == TYPE_HEADERS && f & FLAG_PRIORITY != 0 {
                5
            } else {
                0
            };
            block.extend_from_slice(&payload[skip..]);
            if f & FLAG_END_HEADERS != 0 {
                headers = decoder.decode(&block).unwrap();
                block.clear();
            }
        }
        frames.push((t, f, s, headers, payload));
    }
    frames
}

fn authority_of(headers: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
    &headers.iter().find(|(n, _)| n == b":authority").unwrap().1
}

#[test]
fn only_an_authority_http_refuses_is_replaced() {
    assert!(!is_valid_authority(b"%2Frun%2Fvm%2Flauncher.sock"));
    assert!(!is_valid_authority(b"/run/vm/launcher.sock"));
    assert!(is_valid_authority(b"localhost"));
    assert!(is_valid_authority(b"[::1]:50051"));

    let mut client = loona_hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    // SETTINGS, then three requests on the same HPACK state, then DATA.
    input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]));
    for (stream, authority) in [
        (1, &b"%2Frun%2Fvm%2Flauncher.sock"[..]),
        (3, b"localhost"),
        (5, b"%2Frun%2Fvm%2Flauncher.sock"),
    ] {
        let block = client_block(&mut client, authority);
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, &block));
    }
    input.extend(frame(0x0, FLAG_END_STREAM, 5, b"\0\0\0\0\0"));

    // Fed one byte at a time: frame boundaries never line up with reads.
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    for byte in &input {
        rewriter.feed(std::slice::from_ref(byte), &mut out).unwrap();
    }
    assert_eq!(rewriter.rewritten(), 2);
    let frames = server_view(&out);
    assert_eq!(frames.len(), 5);
    assert_eq!(frames[0].4, [0, 3, 0, 0, 0, 100], "SETTINGS unchanged");
    let authorities: Vec<&[u8]> = frames[1..4].iter().map(|f| authority_of(&f.3)).collect();
    assert_eq!(authorities, [b"localhost"; 3]);
    assert_eq!(
        frames[1].3[2],
        (b":path".to_vec(), b"/grpc.health.v1.Health/Check".to_vec()),
        "the other headers survive"
    );
    assert_eq!(
        (frames[4].0, frames[4].2, &frames[4].4[..]),
        (0x0, 5, &b"\0\0\0\0\0"[..])
    );
}

#[test]
fn a_connection_whose_first_authority_is_accepted_passes_through_untouched() {
    let mut client = loona_hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]));
    // What Go sends, then one the server refuses (a call that overrides the authority). The
    // first block opens with a dynamic table size update, which our encoder never writes:
    // a re-encoded block would differ from the client's. The second refers back to the
    // client's table (its :path is indexed), which only the client's own first block filled.
    for (stream, authority) in [(1, &b"localhost"[..]), (3, b"%2Fs")] {
        let mut block = if stream == 1 {
            vec![0x3f, 0xe1, 0x1f] // table size 4096
        } else {
            vec![]
        };
        block.extend(client_block(&mut client, authority));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, &block));
        input.extend(frame(0x0, FLAG_END_STREAM, stream, b"\0\0\0\0\0"));
    }

    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    for byte in &input {
        rewriter.feed(std::slice::from_ref(byte), &mut out).unwrap();
    }
    assert_eq!(
        out, input,
        "byte for byte, the client's own HPACK encoding included"
    );
    assert_eq!(rewriter.rewritten(), 0);
    let frames = server_view(&out);
    assert_eq!(authority_of(&frames[1].3), b"localhost");
    assert_eq!(
        authority_of(&frames[3].3),
        b"%2Fs",
        "left for the server to refuse"
    );
    assert_eq!(
        frames[3].3[2],
        (b":path".to_vec(), b"/grpc.health.v1.Health/Check".to_vec()),
        "the second block decodes against the table the client's first one filled"
    );
}

#[tokio::test]
async fn a_passed_through_connection_reads_through_the_socket() {
    use tokio::io::AsyncReadExt;
    let mut client = loona_hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    let block = client_block(&mut client, b"localhost");
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    // More than one read's worth after the switch.
    input.extend(frame(0x0, FLAG_END_STREAM, 1, &vec![7u8; 40_000]));
    let mut connection = FixAuthority::new(&input[..]);
    let mut out = Vec::new();
    connection.read_to_end(&mut out).await.unwrap();
    assert!(connection.rewriter.passes_through());
    assert_eq!(out, input);
}

#[test]
fn a_first_block_without_an_authority_decides_for_rewriting() {
    let mut client = loona_hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    let first = client.encode([(&b":method"[..], &b"POST"[..]), (b":path", b"/x")]);
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
    let second = client_block(&mut client, b"%2Fs");
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &second));
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    rewriter.feed(&input, &mut out).unwrap();
    assert_eq!(rewriter.rewritten(), 1);
    assert_eq!(authority_of(&server_view(&out)[1].3), b"localhost");
}

#[test]
fn continuations_padding_and_priority_become_one_clean_block() {
    let mut client = loona_hpack::Encoder::new();
    let block = client_block(&mut client, b"%2Ftmp%2Fs.sock");
    let (a, b) = block.split_at(10);
    let mut headers = vec![3]; // pad length
    headers.extend_from_slice(&[0, 0, 0, 0, 15]); // priority: depends on 0, weight 16
    headers.extend_from_slice(a);
    headers.extend_from_slice(&[0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
        7,
        &headers,
    ));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 7, b));
    let mut out = Vec::new();
    Rewriter::default().feed(&input, &mut out).unwrap();
    let frames = server_view(&out);
    assert_eq!(frames.len(), 1);
    let (t, f, s, h, p) = &frames[0];
    assert_eq!((*t, *s), (TYPE_HEADERS, 7));
    assert_eq!(*f, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
    assert_eq!(p[..5], [0, 0, 0, 0, 15]);
    assert_eq!(authority_of(h), b"localhost");
}

#[test]
fn a_large_block_is_split_into_continuations() {
    let mut client = loona_hpack::Encoder::new();
    let big = vec![b'x'; 40_000];
    let block = client.encode([
        (&b":authority"[..], &b"%2Fs"[..]),
        (b"x-big", big.as_slice()),
    ]);
    let mut input = PREFACE.to_vec();
    for (i, chunk) in block.chunks(MAX_FRAME).enumerate() {
        let last = (i + 1) * MAX_FRAME >= block.len();
        let t = if i == 0 {
            TYPE_HEADERS
        } else {
            TYPE_CONTINUATION
        };
        input.extend(frame(t, if last { FLAG_END_HEADERS } else { 0 }, 1, chunk));
    }
    let mut out = Vec::new();
    Rewriter::default().feed(&input, &mut out).unwrap();
    let frames = server_view(&out);
    assert!(frames.iter().all(|f| f.4.len() <= MAX_FRAME));
    assert_eq!(frames[0].0, TYPE_HEADERS);
    assert!(frames[1..].iter().all(|f| f.0 == TYPE_CONTINUATION));
    let last = frames.last().unwrap();
    assert_eq!(authority_of(&last.3), b"localhost");
    assert_eq!(last.3[1].1, big);
}

#[test]
fn broken_streams_are_refused() {
    let mut out = Vec::new();
    assert!(matches!(
        Rewriter::default().feed(b"GET / HTTP/1.1\r\n", &mut out),
        Err(AuthorityError::Preface)
    ));
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b"\x82"));
    assert!(matches!(
        Rewriter::default().feed(&input, &mut out),
        Err(AuthorityError::StrayContinuation { stream: 1 })
    ));
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, 0, 1, b"\x82"));
    input.extend(frame(0x0, 0, 1, b"x"));
    assert!(matches!(
        Rewriter::default().feed(&input, &mut out),
        Err(AuthorityError::Interleaved { .. })
    ));
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_END_HEADERS,
        1,
        &[9, 1],
    ));
    assert!(matches!(
        Rewriter::default().feed(&input, &mut out),
        Err(AuthorityError::ShortHeaders { .. })
    ));
}
