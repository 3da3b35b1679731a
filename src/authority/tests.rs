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
fn a_block_in_continuations_becomes_one_frame() {
    let mut client = loona_hpack::Encoder::new();
    let big = vec![b'x'; 16_000];
    let block = client.encode([
        (&b":authority"[..], &b"%2Fs"[..]),
        (b"x-big", big.as_slice()),
    ]);
    let mut input = PREFACE.to_vec();
    for (i, chunk) in block.chunks(4096).enumerate() {
        let last = (i + 1) * 4096 >= block.len();
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
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, TYPE_HEADERS);
    assert_eq!(authority_of(&frames[0].3), b"localhost");
    assert_eq!(frames[0].3[1].1, big);
}

#[test]
fn a_large_block_is_written_as_continuations() {
    let block = OpenBlock {
        stream: 1,
        end_stream: true,
        priority: Some([0, 0, 0, 0, 15]),
        fragment: Vec::new(),
        continuations: 0,
    };
    let encoded: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
    let mut out = PREFACE.to_vec();
    write_block(&mut out, &block, &encoded);
    let mut rest = &out[PREFACE.len()..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        frames.push((rest[3], rest[4], rest[9..9 + len].to_vec()));
        rest = &rest[9 + len..];
    }
    assert!(frames.iter().all(|f| f.2.len() <= MAX_FRAME));
    assert_eq!(
        frames[0].1,
        FLAG_PRIORITY | FLAG_END_STREAM,
        "END_HEADERS only on the last"
    );
    assert!(frames[1..].iter().all(|f| f.0 == TYPE_CONTINUATION));
    assert_eq!(frames.last().unwrap().1, FLAG_END_HEADERS);
    let mut joined = frames[0].2[5..].to_vec();
    for f in &frames[1..] {
        joined.extend_from_slice(&f.2);
    }
    assert_eq!(joined, encoded);
}

/// An HPACK integer as an encoder writes it (RFC 7541 §5.1): `flags` in the bits above the
/// `prefix`-bit prefix of the first byte.
fn integer(flags: u8, prefix: u32, mut value: usize) -> Vec<u8> {
    let max = (1usize << prefix) - 1;
    if value < max {
        return vec![flags | value as u8];
    }
    let mut out = vec![flags | max as u8];
    value -= max;
    while value >= 128 {
        out.push(0x80 | (value & 0x7f) as u8);
        value >>= 7;
    }
    out.push(value as u8);
    out
}

/// A literal field with incremental indexing and a new name, not Huffman-coded.
fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x40];
    out.extend(integer(0, 7, name.len()));
    out.extend_from_slice(name);
    out.extend(integer(0, 7, value.len()));
    out.extend_from_slice(value);
    out
}

/// Feeds `input` in one go and returns the error the connection ends with, and how much the
/// server was given before it.
fn refused(input: &[u8]) -> (AuthorityError, usize) {
    let mut out = Vec::new();
    let e = Rewriter::default()
        .feed(input, &mut out)
        .expect_err("the connection must be refused");
    (e, out.len())
}

#[test]
fn an_hpack_bomb_is_refused_without_being_decoded() {
    // The first block fills the client's table with one 4 KiB entry (a list of 4,096 bytes,
    // within the limit); every later one refers to it as often as a block may hold fields,
    // 2 MiB decoded from 512 bytes; 1 MiB of them, 4 GiB decoded.
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[]));
    let mut first = indexed_literal(b"a", &[b'v'; 4063]);
    first.push(0x84); // :path /, from the static table
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
    let mut stream = 3;
    while input.len() < 1 << 20 {
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            stream,
            &[0xbe; MAX_FIELDS],
        ));
        stream += 2;
    }
    let (e, given) = refused(&input);
    assert!(
        matches!(e, AuthorityError::HeaderListTooLarge),
        "refused as {e}"
    );
    assert!(
        given < PREFACE.len() + 9 + first.len() + 64,
        "only the first block reached the server ({given} bytes)"
    );
    // Denser still, 16 KiB of references in a block: refused before decoding.
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &[0xbe; MAX_FRAME]));
    assert!(matches!(refused(&input).0, AuthorityError::TooManyFields));
    // Within the list's limit (four references, 16,384 bytes) it passes.
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &[0xbe; 4]));
    Rewriter::default().feed(&input, &mut Vec::new()).unwrap();
}

#[test]
fn a_list_at_the_servers_limit_passes_and_one_byte_more_is_refused() {
    // ":authority" + "%2Fs" + 32, then "x-big" + the value + 32: exactly the limit.
    let at_limit = MAX_HEADER_LIST - (10 + 4 + 32) - (5 + 32);
    for (len, accepted) in [(at_limit, true), (at_limit + 1, false)] {
        let mut client = loona_hpack::Encoder::new();
        let block = client.encode([
            (&b":authority"[..], &b"%2Fs"[..]),
            (b"x-big", &vec![b'x'; len][..]),
        ]);
        let mut input = PREFACE.to_vec();
        let (first, second) = block.split_at(block.len() / 2);
        input.extend(frame(TYPE_HEADERS, 0, 1, first));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, second));
        let mut out = Vec::new();
        let result = Rewriter::default().feed(&input, &mut out);
        if accepted {
            result.unwrap();
            assert_eq!(server_view(&out)[0].3[1].1.len(), len);
        } else {
            assert!(matches!(result, Err(AuthorityError::HeaderListTooLarge)));
        }
    }
}

#[test]
fn a_table_size_update_over_the_servers_is_refused() {
    // 4,096 (what the server advertises) passes; one more, or the 2^28 - 1 that would let one
    // entry hold a whole block, does not.
    for (size, accepted) in [
        (MAX_TABLE, true),
        (MAX_TABLE + 1, false),
        ((1 << 28) - 1, false),
    ] {
        let mut block = integer(0x20, 5, size);
        block.push(0x82); // :method GET
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
        let result = Rewriter::default().feed(&input, &mut Vec::new());
        if accepted {
            result.unwrap();
        } else {
            assert!(
                matches!(result, Err(AuthorityError::TableTooLarge)),
                "{size}: {result:?}"
            );
        }
    }
}

#[test]
fn an_oversized_header_frame_is_refused_before_it_is_buffered() {
    // Only the frame's header: its 16 MiB payload is never waited for.
    let mut input = PREFACE.to_vec();
    write_frame_header(&mut input, (1 << 24) - 1, TYPE_HEADERS, FLAG_END_HEADERS, 1);
    let (e, _) = refused(&input);
    assert!(matches!(e, AuthorityError::FrameTooLarge { len } if len == (1 << 24) - 1));
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, 0, 1, b"\x82"));
    write_frame_header(&mut input, MAX_FRAME + 1, TYPE_CONTINUATION, 0, 1);
    let (e, _) = refused(&input);
    assert!(matches!(e, AuthorityError::FrameTooLarge { .. }), "{e}");
    // A large frame of another kind passes unbuffered; the server judges it.
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x0, 0, 1, &vec![0; MAX_FRAME + 1]));
    let mut out = Vec::new();
    Rewriter::default().feed(&input, &mut out).unwrap();
    assert_eq!(out, input);
}

#[test]
fn an_over_long_continuation_chain_is_refused() {
    // Full frames: the block outgrows its limit, before any of it is decoded.
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, 0, 1, &[0xbe; MAX_FRAME]));
    for _ in 0..MAX_BLOCK / MAX_FRAME {
        input.extend(frame(TYPE_CONTINUATION, 0, 1, &[0xbe; MAX_FRAME]));
    }
    let (e, given) = refused(&input);
    assert!(matches!(e, AuthorityError::BlockTooLarge), "{e}");
    assert_eq!(given, PREFACE.len());
    // Empty frames: nothing grows, but the chain is held to what the server would take.
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, 0, 1, b"\x82"));
    for _ in 0..MAX_CONTINUATIONS {
        input.extend(frame(TYPE_CONTINUATION, 0, 1, &[]));
    }
    let mut rewriter = Rewriter::default();
    rewriter.feed(&input, &mut Vec::new()).unwrap();
    let one_more = frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[]);
    assert!(matches!(
        rewriter.feed(&one_more, &mut Vec::new()),
        Err(AuthorityError::TooManyContinuations)
    ));
}

#[test]
fn a_block_of_more_fields_than_the_list_can_hold_is_refused_before_decoding() {
    let mut input = PREFACE.to_vec();
    // Empty Huffman-coded values: two bytes a field, each a Huffman table to the decoder.
    let block: Vec<u8> = [0x01, 0x80].repeat(MAX_FIELDS + 1);
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
    assert!(matches!(refused(&input).0, AuthorityError::TooManyFields));
    assert_eq!(count_fields(&block[..2 * MAX_FIELDS]).unwrap(), MAX_FIELDS);
    // Cut short: refused, not read past.
    assert!(count_fields(&[0x00, 0x05, b'a']).is_err());
    assert!(count_fields(&[0xff]).is_err());
}

/// A waker that counts its wakes.
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn the_connection_yields_between_decoded_blocks() {
    let mut client = loona_hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    for stream in [1, 3, 5] {
        let block = client_block(&mut client, b"%2Fs");
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, &block));
    }
    let counter = std::sync::Arc::new(CountingWaker(Default::default()));
    let waker = std::task::Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    // One read gets all three blocks.
    let mut connection = FixAuthority::new(&input[..]);
    let mut out = Vec::new();
    let mut polls = Vec::new();
    loop {
        let mut storage = [0u8; 64 * 1024];
        let mut buf = ReadBuf::new(&mut storage);
        match Pin::new(&mut connection).poll_read(&mut cx, &mut buf) {
            Poll::Pending => polls.push(None),
            Poll::Ready(result) => {
                result.unwrap();
                if buf.filled().is_empty() {
                    break;
                }
                polls.push(Some(frames_in(buf.filled())));
                out.extend_from_slice(buf.filled());
            }
        }
    }
    // The preface and the first block, then a yield before each later block.
    assert_eq!(polls, [Some(1), None, Some(1), None, Some(1)]);
    assert_eq!(
        counter.0.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "it wakes itself to go on"
    );
    assert_eq!(server_view(&out).len(), 3);
}

/// How many frames `bytes` holds, after the preface if it starts with it.
fn frames_in(bytes: &[u8]) -> usize {
    let mut rest = bytes.strip_prefix(PREFACE).unwrap_or(bytes);
    let mut frames = 0;
    while !rest.is_empty() {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        rest = &rest[9 + len..];
        frames += 1;
    }
    frames
}
