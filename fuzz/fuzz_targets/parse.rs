//! Fuzzes `Gguf::parse` on arbitrary bytes. Parsing must never panic, and whatever parses must
//! survive the writer: written back, it parses again, and writing that gives the same bytes.

#![no_main]

use lamina_gguf::{Gguf, GgufWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = Gguf::parse(data) else { return };
    for t in &gguf.tensors {
        assert!(gguf.data_offset + t.offset + t.size <= data.len() as u64);
    }
    let mut first = Vec::new();
    GgufWriter::from_parts(&gguf, data)
        .expect("a parsed file is writable")
        .write_to(&mut first)
        .expect("writing to memory succeeds");
    let again = Gguf::parse(&first).expect("what the writer writes parses");
    assert_eq!(again.tensors.len(), gguf.tensors.len());
    assert_eq!(again.metadata.len(), gguf.metadata.len());
    for (a, b) in again.tensors.iter().zip(&gguf.tensors) {
        assert_eq!(
            (&a.name, a.dtype, a.shape, a.size),
            (&b.name, b.dtype, b.shape, b.size)
        );
    }
    let mut second = Vec::new();
    GgufWriter::from_parts(&again, &first)
        .unwrap()
        .write_to(&mut second)
        .unwrap();
    assert!(first == second, "writing a written file changed it");
});
