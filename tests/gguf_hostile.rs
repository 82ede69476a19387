//! Truncated, corrupt and hostile GGUF files give typed errors: no panic, and memory bounded
//! by a small multiple of the file size (a counting allocator measures the parser's peak).

mod gguf_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use fucina::gguf::{GgufError, GgufFile, GgufValue};
use gguf_common::{f32_bytes, put_value, sample, Writer};

struct Counting;

thread_local! {
    static CUR: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = CUR.try_with(|c| {
            let v = c.get() + l.size();
            c.set(v);
            let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
        });
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let _ = CUR.try_with(|c| c.set(c.get().saturating_sub(l.size())));
        System.dealloc(p, l)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Parse `bytes` and check the parser's peak allocation stays within 48x the input + 64 KiB.
fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let input = bytes.to_vec();
    let n = input.len();
    let base = CUR.with(|c| c.get());
    PEAK.with(|p| p.set(base));
    let r = GgufFile::from_bytes(input);
    let peak = PEAK.with(|p| p.get()) - base;
    assert!(
        peak <= 48 * n + (64 << 10),
        "parser allocated {peak} bytes for a {n}-byte file"
    );
    r
}

#[test]
fn gguf_every_truncation_is_an_error() {
    let full = sample(3).build();
    assert!(parse(&full).is_ok());
    for n in 0..full.len() {
        match parse(&full[..n]) {
            Err(_) => {}
            Ok(_) => panic!("truncated to {n} of {} bytes accepted", full.len()),
        }
    }
}

#[test]
fn gguf_byte_mutations_never_panic() {
    let full = sample(3).build();
    let header_end = GgufFile::from_bytes(full.clone()).unwrap().data_offset() as usize;
    let (mut ok, mut err) = (0, 0);
    for pos in 0..header_end {
        for v in [
            0x00u8,
            0xff,
            0x80,
            0x7f,
            0x01,
            full[pos].wrapping_add(1),
            full[pos] ^ 0x40,
        ] {
            let mut m = full.clone();
            m[pos] = v;
            match parse(&m) {
                Ok(g) => {
                    ok += 1;
                    use_all(&g);
                }
                Err(_) => err += 1,
            }
        }
        // wide fields: overwrite 8 bytes with huge or boundary values
        for word in [u64::MAX, 1 << 32, 1 << 62, i64::MAX as u64 + 1, 0] {
            let mut m = full.clone();
            let end = (pos + 8).min(m.len());
            m[pos..end].copy_from_slice(&word.to_le_bytes()[..end - pos]);
            match parse(&m) {
                Ok(g) => {
                    ok += 1;
                    use_all(&g);
                }
                Err(_) => err += 1,
            }
        }
    }
    assert!(
        err > header_end,
        "mutations rejected: {err}, accepted: {ok}"
    );
}

/// Every accessor on a file that parsed: tensors dequantise or give typed errors.
fn use_all(g: &GgufFile) {
    for k in g.metadata().keys() {
        let _ = (
            g.get_u64(k),
            g.get_f32(k),
            g.get_str(k),
            g.get_bool(k),
            g.get_u64_array(k),
            g.get_f32_array(k),
        );
    }
    let _ = g.architecture();
    for t in g.tensor_infos() {
        let r = g.tensor(&t.name).expect("listed tensor");
        assert_eq!(r.data.len() as u64, t.n_bytes);
        let _ = r.to_f32();
    }
}

/// Header bytes built by hand: magic, version, counts, then `body`.
fn raw(version: u32, n_tensors: u64, n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend(version.to_le_bytes());
    v.extend(n_tensors.to_le_bytes());
    v.extend(n_kv.to_le_bytes());
    v.extend(body);
    v
}

fn kstr(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s);
    v
}

fn kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
    let mut v = kstr(key.as_bytes());
    v.extend(ty.to_le_bytes());
    v.extend(value);
    v
}

fn err(bytes: &[u8]) -> GgufError {
    match parse(bytes) {
        Err(e) => e,
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn gguf_hostile_headers_give_typed_errors() {
    use GgufError as E;
    assert!(matches!(err(b""), E::Truncated { .. }));
    assert!(matches!(err(b"GGML\x03\0\0\0"), E::BadMagic(_)));
    assert!(matches!(err(&raw(1, 0, 0, &[])), E::UnsupportedVersion(1)));
    assert!(matches!(err(&raw(4, 0, 0, &[])), E::UnsupportedVersion(4)));
    assert!(matches!(
        err(&raw(0x0300_0000, 0, 0, &[])),
        E::UnsupportedVersion(_)
    ));
    assert!(matches!(
        err(&raw(3, u64::MAX, 0, &[])),
        E::CountTooLarge { .. }
    ));
    assert!(matches!(
        err(&raw(3, 0, u64::MAX, &[])),
        E::CountTooLarge { .. }
    ));
    assert!(matches!(
        err(&raw(3, 0, 1 << 40, &[0; 64])),
        E::CountTooLarge { .. }
    ));
    // key string longer than the file
    let mut body = (u64::MAX).to_le_bytes().to_vec();
    body.extend([0u8; 16]);
    assert!(matches!(err(&raw(3, 0, 1, &body)), E::CountTooLarge { .. }));
    // key not UTF-8
    let mut body = kstr(&[0xff, 0xfe]);
    body.extend(4u32.to_le_bytes());
    body.extend(1u32.to_le_bytes());
    assert!(matches!(err(&raw(3, 0, 1, &body)), E::BadString { .. }));
    // string value not UTF-8
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", 8, &kstr(&[0xc3, 0x28])))),
        E::BadString { .. }
    ));
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", 13, &[0; 8]))),
        E::UnknownValueType { id: 13, .. }
    ));
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", u32::MAX, &[0; 8]))),
        E::UnknownValueType { .. }
    ));
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", 7, &[2]))),
        E::BadBool { byte: 2, .. }
    ));
    // array of u64::MAX u8 / of huge strings / of unknown element type
    let mut arr = 0u32.to_le_bytes().to_vec();
    arr.extend(u64::MAX.to_le_bytes());
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", 9, &arr))),
        E::CountTooLarge { .. }
    ));
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend(4u64.to_le_bytes());
    arr.extend(u64::MAX.to_le_bytes());
    arr.extend([0u8; 40]);
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", 9, &arr))),
        E::CountTooLarge { .. }
    ));
    let mut arr = 77u32.to_le_bytes().to_vec();
    arr.extend(1u64.to_le_bytes());
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", 9, &arr))),
        E::UnknownValueType { id: 77, .. }
    ));
    // arrays nested 9 deep (and 10,000 deep: no stack overflow)
    for depth in [9usize, 10_000] {
        let mut v = Vec::new();
        for _ in 0..depth {
            v.extend(9u32.to_le_bytes());
            v.extend(1u64.to_le_bytes());
        }
        v.extend(0u32.to_le_bytes());
        v.extend(0u64.to_le_bytes());
        assert!(matches!(
            err(&raw(3, 0, 1, &kv("k", 9, &v))),
            E::ArrayTooDeep { .. }
        ));
    }
    // 8 deep is fine
    let mut nested = GgufValue::Array(vec![GgufValue::U8(1)]);
    for _ in 0..7 {
        nested = GgufValue::Array(vec![nested]);
    }
    let mut v = Vec::new();
    put_value(&mut v, &nested);
    assert!(parse(&raw(3, 0, 1, &kv("k", 9, &v))).is_ok());
    // duplicate key
    let mut body = kv("k", 4, &[1, 0, 0, 0]);
    body.extend(kv("k", 4, &[2, 0, 0, 0]));
    assert!(matches!(err(&raw(3, 0, 2, &body)), E::DuplicateKey(_)));
}

fn one_tensor(ne: &[u64], ty: u32, data: Vec<u8>) -> Writer {
    Writer::new(3).tensor("t", ne, ty, data)
}

#[test]
fn gguf_hostile_tensor_infos_give_typed_errors() {
    use GgufError as E;
    for a in [
        GgufValue::U32(0),
        GgufValue::U32(3),
        GgufValue::U64(1 << 40),
        GgufValue::String("32".into()),
    ] {
        let w = Writer::new(3).kv("general.alignment", a.clone());
        assert!(matches!(err(&w.build()), E::BadAlignment(_)), "{a:?}");
    }
    assert!(matches!(
        err(&one_tensor(&[1, 1, 1, 1, 1], 0, f32_bytes(&[1.0])).build()),
        E::TooManyDims { n_dims: 5, .. }
    ));
    assert!(matches!(
        err(&one_tensor(&[1], 99, vec![0; 4]).build()),
        E::UnknownTensorType { id: 99, .. }
    ));
    assert!(matches!(
        err(&one_tensor(&[1], 16, vec![0; 4]).build()),
        E::UnknownTensorType { id: 16, .. }
    ));
    assert!(matches!(
        err(&one_tensor(&[u64::MAX / 2, 4], 0, vec![]).build()),
        E::ShapeOverflow { .. }
    ));
    assert!(matches!(
        err(&one_tensor(&[1 << 32, 1 << 32], 0, vec![]).build()),
        E::ShapeOverflow { .. }
    ));
    assert!(matches!(
        err(&one_tensor(&[1 << 62], 0, vec![]).build()),
        E::ShapeOverflow { .. }
    ));
    assert!(matches!(
        err(&one_tensor(&[31], 2, vec![0; 18]).build()),
        E::MisalignedRow { .. }
    ));
    // data missing or at absurd offsets
    assert!(matches!(
        err(&one_tensor(&[1024], 0, vec![]).build()),
        E::TensorOutOfRange { .. }
    ));
    let mut w = one_tensor(&[1], 0, f32_bytes(&[1.0]));
    w.offsets = Some(vec![u64::MAX - 31]);
    assert!(matches!(err(&w.build()), E::TensorOutOfRange { .. }));
    w.offsets = Some(vec![1 << 20]);
    assert!(matches!(err(&w.build()), E::TensorOutOfRange { .. }));
    w.offsets = Some(vec![4]);
    assert!(matches!(
        err(&w.build()),
        E::MisalignedTensor { offset: 4, .. }
    ));
    // overlapping and duplicate tensors
    let mut w = Writer::new(3)
        .tensor("a", &[16], 0, f32_bytes(&[0.0; 16]))
        .tensor("b", &[1], 0, f32_bytes(&[1.0]));
    w.offsets = Some(vec![0, 32]);
    assert!(matches!(err(&w.build()), E::TensorOverlap { .. }));
    w.offsets = Some(vec![0, 64]);
    assert!(parse(&w.build()).is_ok());
    let w = Writer::new(3)
        .tensor("a", &[1], 0, f32_bytes(&[0.0]))
        .tensor("a", &[1], 0, f32_bytes(&[1.0]));
    assert!(matches!(err(&w.build()), E::DuplicateTensor(_)));
    // zero-sized tensors are fine anywhere in range
    assert!(parse(&one_tensor(&[0, 7], 0, vec![]).build()).is_ok());
}

#[test]
fn gguf_error_messages_say_what_is_wrong() {
    let e = err(&raw(3, 0, 1 << 40, &[0; 64])).to_string();
    assert!(
        e.contains("metadata count") && e.contains("1099511627776"),
        "{e}"
    );
    let e = err(&one_tensor(&[1], 99, vec![0; 4]).build()).to_string();
    assert!(e.contains("tensor t") && e.contains("99"), "{e}");
    let e = fucina::gguf::GgufFile::open(std::path::Path::new("/nonexistent/x.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/x.gguf"), "{e}");
}

#[test]
fn gguf_empty_file_on_disk() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("e.gguf");
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&p),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn gguf_allocation_counter_sees_the_parser() {
    // a 100k-element u8 array costs 100k GgufValues: the counter must see that much, and the
    // 48x bound in `parse` must hold for it
    let w = Writer::new(3).kv("big", GgufValue::Array(vec![GgufValue::U8(7); 100_000]));
    let bytes = w.build();
    let base = CUR.with(|c| c.get());
    PEAK.with(|p| p.set(base));
    let g = GgufFile::from_bytes(bytes.clone()).unwrap();
    let peak = PEAK.with(|p| p.get()) - base;
    assert!(
        peak >= 100_000 * std::mem::size_of::<GgufValue>(),
        "peak {peak}"
    );
    assert_eq!(g.get_array("big").unwrap().len(), 100_000);
    drop(g);
    assert!(parse(&bytes).is_ok());
}

#[test]
fn gguf_metadata_value_cap() {
    let n = fucina::gguf::MAX_METADATA_VALUES + 1;
    let mut arr = 0u32.to_le_bytes().to_vec();
    arr.extend(n.to_le_bytes());
    arr.resize(arr.len() + n as usize, 1);
    assert!(matches!(
        err(&raw(3, 0, 1, &kv("k", 9, &arr))),
        GgufError::TooManyValues { .. }
    ));
}
