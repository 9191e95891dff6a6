//! The messages ranks exchange: requests from the front (rank 0) to the rank that owns a
//! device, their replies, and data moving between ranks for copies. Encoded with postcard;
//! every rank runs the same binary, so the encoding needs no versioning.

use lamina_core::graph::{Binding, MAX_SRC, Op, Tensor, TensorId};
use lamina_core::tensor::{Layout, TensorFlags};
use serde::{Deserialize, Serialize};

/// A range of a buffer that lives on the rank the message goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceRef {
    pub buffer: u64,
    pub offset: usize,
    pub len: usize,
}

/// A tensor of a graph, its binding naming a buffer of the receiving rank.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireTensor {
    pub layout: Layout,
    pub op: Op,
    pub src: [Option<TensorId>; MAX_SRC],
    pub view_src: Option<TensorId>,
    pub view_offset: usize,
    pub flags: TensorFlags,
    pub name: String,
    pub binding: Option<(u64, usize)>,
}

impl WireTensor {
    /// `t` as sent, bound (if at all) to buffer `binding.0` of the receiving rank.
    pub fn from_tensor(t: &Tensor, binding: Option<(u64, usize)>) -> WireTensor {
        WireTensor {
            layout: t.layout,
            op: t.op,
            src: t.src,
            view_src: t.view_src,
            view_offset: t.view_offset,
            flags: t.flags,
            name: t.name.clone(),
            binding,
        }
    }

    /// A tensor the receiving rank does not need: only its shape, so ids stay the same.
    pub fn placeholder(t: &Tensor) -> WireTensor {
        WireTensor {
            layout: t.layout,
            op: Op::Leaf,
            src: Default::default(),
            view_src: None,
            view_offset: 0,
            flags: t.flags,
            name: String::new(),
            binding: None,
        }
    }

    /// The tensor, bound to the receiving rank's memory.
    pub fn into_tensor(self, binding: Option<Binding>) -> Tensor {
        Tensor {
            layout: self.layout,
            op: self.op,
            src: self.src,
            view_src: self.view_src,
            view_offset: self.view_offset,
            flags: self.flags,
            name: self.name,
            binding,
        }
    }
}

/// What a rank tells the front about one of its devices.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub description: String,
    /// `DeviceType` as its `Display` spells it.
    pub device_type: String,
    pub device_id: String,
    pub free: u64,
    pub total: u64,
    pub alignment: usize,
    pub max_size: usize,
    pub maps_host_memory: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// The rank's devices.
    Hello,
    /// Stop serving (the rank's process then exits).
    Shutdown,
    Alloc {
        device: u32,
        size: usize,
    },
    /// Map the rank's own copy of a model file, checked against the front's.
    MapFile {
        device: u32,
        path: String,
        size: u64,
        header_sha256: [u8; 32],
    },
    /// Map the rank's own copy of a model file, checked as for `MapFile`, to read weights
    /// from (`WriteFromFile`) into memory that cannot map it.
    OpenFile {
        path: String,
        size: u64,
        header_sha256: [u8; 32],
    },
    /// Write the bytes at `offset` of an opened file into the slice.
    WriteFromFile {
        slice: SliceRef,
        file: u64,
        offset: usize,
    },
    Free {
        buffer: u64,
    },
    Write {
        slice: SliceRef,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Read {
        slice: SliceRef,
    },
    Fill {
        slice: SliceRef,
        value: u8,
    },
    /// A blocking copy between two buffers of the rank.
    Copy {
        src: SliceRef,
        dst: SliceRef,
    },
    /// Queue the compute nodes `nodes` of the graph made of `tensors`.
    Compute {
        device: u32,
        tensors: Vec<WireTensor>,
        nodes: (usize, usize),
    },
    SetAsync {
        device: u32,
        slice: SliceRef,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Reply with the slice's bytes once the device's queued work is done.
    GetAsync {
        device: u32,
        slice: SliceRef,
    },
    Synchronize {
        device: u32,
    },
    NewEvent {
        device: u32,
    },
    FreeEvent {
        event: u64,
    },
    Record {
        device: u32,
        event: u64,
    },
    Wait {
        device: u32,
        event: u64,
    },
    /// Reply once the event has reached `value`.
    EventWait {
        event: u64,
        value: u64,
    },
    EventQuery {
        event: u64,
    },
    /// Send the slice, after the device's queued work, to rank `to` as data `tag`.
    SendTo {
        device: u32,
        slice: SliceRef,
        to: u32,
        tag: u64,
    },
    /// Data `tag` (from whichever rank) goes into the slice, in the device's queue order.
    Expect {
        device: u32,
        slice: SliceRef,
        tag: u64,
    },
    /// The device's queue waits until data `tag` (empty: a signal) arrives from whichever rank.
    WaitSignal {
        device: u32,
        tag: u64,
    },
    /// Once the event has reached `value`, send rank `to` the signal `tag`.
    SignalWhen {
        event: u64,
        value: u64,
        to: u32,
        tag: u64,
    },
    /// An ordered copy between two devices of the rank.
    CopyAsync {
        src_device: u32,
        dst_device: u32,
        src: SliceRef,
        dst: SliceRef,
        fenced: bool,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Unit,
    Devices(Vec<DeviceInfo>),
    Buffer(u64),
    Event(u64),
    File(u64),
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Bool(bool),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Message {
    /// `seq` 0: no reply wanted.
    Request { seq: u64, request: Request },
    Reply {
        seq: u64,
        reply: Result<Reply, String>,
    },
    Data {
        tag: u64,
        #[serde(with = "result_bytes")]
        bytes: Result<Vec<u8>, String>,
    },
}

/// Byte payloads (activations, logits, weights) as one block, not byte by byte as serde
/// writes a `Vec<u8>` by default (which cost milliseconds per megabyte of logits).
mod result_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub fn serialize<S: Serializer>(v: &Result<Vec<u8>, String>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().map(|b| Bytes::new(b)).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Result<Vec<u8>, String>, D::Error> {
        Ok(Result::<ByteBuf, String>::deserialize(d)?.map(ByteBuf::into_vec))
    }
}

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain data into a Vec cannot fail.
        postcard::to_stdvec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Message, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}
