//! One rank's end of the protocol, the same on the front and on the ranks that serve devices:
//! replies matched to the requests waiting for them, a mailbox for data that other ranks send
//! for copies, and one sender thread per local stream that ships a slice once the stream's
//! queued work is done.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use lamina_backend::{
    BackendError, BufferSlice, DeviceKey, Event, PendingRead, Stream, copy_async, wait_bound,
};

use crate::transport::Transport;
use crate::wire::{Message, Reply, Request};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the maps consistent; a panic elsewhere does not matter.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a reply goes.
enum ReplySlot {
    /// A caller blocked in [`Node::call`].
    Caller(SyncSender<Result<Reply, String>>),
    /// An asynchronous read: the reply's data completes it.
    Read(PendingRead),
}

/// A copy's data, in whichever order it and its destination arrive.
enum Mail {
    Arrived(Result<Vec<u8>, String>),
    Expected(Box<dyn FnOnce(Result<Vec<u8>, String>) + Send>),
}

/// A request received, for the rank's device server: (source rank, seq, request).
pub type Incoming = (usize, u64, Request);

type SendJob = (
    PendingRead,
    Box<dyn FnOnce(Result<Vec<u8>, BackendError>) + Send>,
);

pub struct Node {
    transport: Arc<dyn Transport>,
    next_seq: AtomicU64,
    next_tag: AtomicU64,
    replies: Mutex<HashMap<u64, ReplySlot>>,
    mailbox: Mutex<HashMap<u64, Mail>>,
    requests: Mutex<Option<Sender<Incoming>>>,
    senders: Mutex<HashMap<DeviceKey, Sender<SendJob>>>,
    /// The first failure of work nobody waits on (data that came wrong); reported by the next
    /// synchronization.
    failure: Mutex<Option<String>>,
    /// Bytes and messages sent, for the figures (`bytes_sent`, `LAMINA_MPI_STATS`).
    sent: AtomicU64,
    messages: AtomicU64,
    /// Ranks that did not answer or take a message within the wait bound: later messages to
    /// them fail at once. `lost_changed` wakes [`Node::wait_lost`].
    lost: Mutex<BTreeSet<usize>>,
    lost_changed: Condvar,
    /// The threads this node started (senders, signals, late answers), joined by
    /// [`Node::finish`] so that nothing of the node outlives it. Each one's wait is bounded.
    helpers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Node {
    /// Starts the rank's end over `transport`; requests that arrive go to the returned
    /// receiver (the device server's; the front gets none and drops it).
    pub fn start(transport: Arc<dyn Transport>) -> (Arc<Node>, Receiver<Incoming>) {
        let (tx, rx) = channel();
        let node = Arc::new(Node {
            transport: transport.clone(),
            next_seq: AtomicU64::new(1),
            next_tag: AtomicU64::new(1),
            replies: Mutex::new(HashMap::new()),
            mailbox: Mutex::new(HashMap::new()),
            requests: Mutex::new(Some(tx)),
            senders: Mutex::new(HashMap::new()),
            failure: Mutex::new(None),
            sent: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            lost: Mutex::new(BTreeSet::new()),
            lost_changed: Condvar::new(),
            helpers: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&node);
        transport.start(Box::new(move |from, bytes| {
            if let Some(node) = weak.upgrade() {
                node.deliver(from, &bytes);
            }
        }));
        (node, rx)
    }

    pub fn rank(&self) -> usize {
        self.transport.rank()
    }

    pub fn size(&self) -> usize {
        self.transport.size()
    }

    /// Bytes this rank has sent so far.
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn stop(&self) {
        lock(&self.requests).take();
        self.transport.stop();
    }

    /// Runs `f` on a thread of the node's (joined by [`Node::finish`]).
    pub fn spawn(&self, name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), BackendError> {
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map_err(|e| self.error(self.rank(), format!("cannot start a thread: {e}")))?;
        let mut helpers = lock(&self.helpers);
        helpers.retain(|h| !h.is_finished());
        helpers.push(handle);
        Ok(())
    }

    /// [`Node::stop`], then the transport's end for the process (MPI_Finalize), once the
    /// node's threads are done. With `LAMINA_MPI_STATS` set, each rank first prints what it
    /// sent.
    pub fn finish(&self) {
        // The stream senders end once their queues are empty; every helper's wait is bounded.
        lock(&self.senders).clear();
        let helpers = std::mem::take(&mut *lock(&self.helpers));
        for h in helpers {
            let _ = h.join();
        }
        if std::env::var_os("LAMINA_MPI_STATS").is_some() {
            eprintln!(
                "lamina-mpi: rank {} sent {} bytes in {} messages",
                self.rank(),
                self.sent.load(Ordering::Relaxed),
                self.messages.load(Ordering::Relaxed)
            );
        }
        self.stop();
        self.transport.finish();
    }

    fn deliver(&self, from: usize, bytes: &[u8]) {
        match Message::decode(bytes) {
            Ok(Message::Request { seq, request }) => {
                if let Some(tx) = lock(&self.requests).as_ref() {
                    let _ = tx.send((from, seq, request));
                }
            }
            Ok(Message::Reply { seq, reply }) => match lock(&self.replies).remove(&seq) {
                Some(ReplySlot::Caller(tx)) => {
                    let _ = tx.send(reply);
                }
                Some(ReplySlot::Read(into)) => into.complete(match reply {
                    Ok(Reply::Data(data)) => Ok(data),
                    Ok(other) => Err(self.error(from, format!("unexpected reply {other:?}"))),
                    Err(e) => Err(self.error(from, e)),
                }),
                None => {}
            },
            Ok(Message::Data { tag, bytes }) => {
                let mut mailbox = lock(&self.mailbox);
                match mailbox.remove(&tag) {
                    Some(Mail::Expected(put)) => {
                        drop(mailbox);
                        put(bytes);
                    }
                    _ => {
                        mailbox.insert(tag, Mail::Arrived(bytes));
                    }
                }
            }
            Err(e) => self.fail(format!("undecodable message from rank {from}: {e}")),
        }
    }

    /// The ranks that stopped answering (a call or a send to them timed out or failed).
    pub fn lost_ranks(&self) -> Vec<usize> {
        lock(&self.lost).iter().copied().collect()
    }

    /// Ends the whole job at once (MPI_Abort), for when a rank cannot be stopped cleanly.
    pub fn abort(&self, code: i32) -> ! {
        self.transport.abort(code);
        std::process::exit(code)
    }

    /// A device error naming rank `rank`.
    pub fn error(&self, rank: usize, message: impl std::fmt::Display) -> BackendError {
        BackendError::Device {
            device: format!("rank {rank}"),
            message: message.to_string(),
        }
    }

    pub fn fail(&self, message: String) {
        lock(&self.failure).get_or_insert(message);
    }

    /// The first failure since the last call.
    pub fn take_failure(&self) -> Option<String> {
        lock(&self.failure).take()
    }

    fn send(&self, to: usize, message: &Message) -> Result<(), BackendError> {
        if lock(&self.lost).contains(&to) {
            return Err(self.error(to, "stopped answering earlier"));
        }
        let bytes = message.encode();
        self.sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.transport.send(to, bytes).map_err(|e| {
            self.mark_lost(to);
            self.error(to, format!("cannot send: {e}"))
        })
    }

    fn mark_lost(&self, rank: usize) {
        lock(&self.lost).insert(rank);
        self.lost_changed.notify_all();
    }

    /// Blocks until some rank is lost (for a server that must stop then); returns them.
    pub fn wait_lost(&self) -> Vec<usize> {
        let mut lost = lock(&self.lost);
        while lost.is_empty() {
            lost = self
                .lost_changed
                .wait(lost)
                .unwrap_or_else(|e| e.into_inner());
        }
        lost.iter().copied().collect()
    }

    /// Sends a request that wants no reply.
    pub fn post(&self, to: usize, request: Request) -> Result<(), BackendError> {
        self.send(to, &Message::Request { seq: 0, request })
    }

    /// Sends a request and waits for its reply, at most the device layer's wait bound.
    pub fn call(&self, to: usize, request: Request) -> Result<Reply, BackendError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        lock(&self.replies).insert(seq, ReplySlot::Caller(tx));
        let what = format!("{request:?}");
        if let Err(e) = self.send(to, &Message::Request { seq, request }) {
            lock(&self.replies).remove(&seq);
            return Err(e);
        }
        let start = Instant::now();
        let reply = match wait_bound() {
            Some(bound) => rx.recv_timeout(bound).map_err(|_| ()),
            None => rx.recv().map_err(|_| ()),
        };
        match reply {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(self.error(to, e)),
            Err(()) => {
                lock(&self.replies).remove(&seq);
                self.mark_lost(to);
                let mut what = what;
                what.truncate(80);
                Err(BackendError::Timeout {
                    what: format!("rank {to} to answer {what}"),
                    waited: start.elapsed(),
                })
            }
        }
    }

    /// Sends a request whose `Data` reply completes `into`.
    pub fn call_read(
        &self,
        to: usize,
        request: Request,
        into: PendingRead,
    ) -> Result<(), BackendError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        lock(&self.replies).insert(seq, ReplySlot::Read(into));
        let r = self.send(to, &Message::Request { seq, request });
        if r.is_err() {
            lock(&self.replies).remove(&seq);
        }
        r
    }

    /// Answers request `seq` of rank `to` (nothing for a request that wants no reply).
    pub fn reply(&self, to: usize, seq: u64, reply: Result<Reply, String>) {
        if seq == 0 {
            if let Err(e) = reply {
                self.fail(e);
            }
            return;
        }
        if let Err(e) = self.send(to, &Message::Reply { seq, reply }) {
            self.fail(e.to_string());
        }
    }

    /// A fresh tag for one copy's data (only the front mints them).
    pub fn new_tag(&self) -> u64 {
        self.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `then` with `src`'s bytes once `stream`'s queued work is done, on the stream's
    /// sender thread (so the host does not wait, and sends keep the stream's order).
    pub fn after_read(
        &self,
        stream: &Stream,
        src: &BufferSlice,
        then: Box<dyn FnOnce(Result<Vec<u8>, BackendError>) + Send>,
    ) -> Result<(), BackendError> {
        let pending = stream.get_async(src)?;
        let mut senders = lock(&self.senders);
        let tx = senders.entry(stream.device()).or_insert_with(|| {
            let (tx, rx) = channel::<SendJob>();
            let _ = self.spawn(
                &format!("lamina-send-{}", stream.device_name()),
                move || {
                    for (pending, then) in rx {
                        then(pending.wait());
                    }
                },
            );
            tx
        });
        tx.send((pending, then))
            .map_err(|_| BackendError::QueueClosed(stream.device_name().to_owned()))
    }

    /// Sends `src` to rank `to` as data `tag` once `stream`'s queued work is done.
    pub fn send_after(
        self: &Arc<Self>,
        stream: &Stream,
        src: &BufferSlice,
        to: usize,
        tag: u64,
    ) -> Result<(), BackendError> {
        let node = self.clone();
        self.after_read(
            stream,
            src,
            Box::new(move |data| {
                let bytes = data.map_err(|e| e.to_string());
                if let Err(e) = node.send(to, &Message::Data { tag, bytes }) {
                    node.fail(e.to_string());
                }
            }),
        )
    }

    /// Makes data `tag` land in `dst` in `stream`'s order: the stream waits for the data,
    /// then copies it from a staging buffer of `dst`'s type, so later work sees it and earlier
    /// readers of `dst` are not overtaken. The host does not wait.
    pub fn expect_into(
        self: &Arc<Self>,
        stream: &Stream,
        dst: &BufferSlice,
        tag: u64,
    ) -> Result<(), BackendError> {
        let staging = dst.buffer.buffer_type().alloc_buffer(dst.len)?;
        let staging = BufferSlice::new(&staging, 0, dst.len)?;
        let arrived = Event::new(stream.device(), stream.device_name());
        let value = arrived.record_with(|_| Ok(()))?;
        stream.wait(&arrived)?;
        copy_async(stream, stream, &staging, dst)?;
        // Weak: data that never comes leaves this in the mailbox, which must not keep the
        // node alive.
        let node = Arc::downgrade(self);
        let len = dst.len;
        let put = move |bytes: Result<Vec<u8>, String>| {
            let r = bytes.and_then(|b| {
                if b.len() != len {
                    return Err(format!("copy data of {} bytes for {len}", b.len()));
                }
                staging.write(&b).map_err(|e| e.to_string())
            });
            if let (Err(e), Some(node)) = (r, node.upgrade()) {
                node.fail(e);
            }
            arrived.signal(value);
        };
        self.on_data(tag, Box::new(put));
        Ok(())
    }

    /// Makes `stream`'s later work wait for the signal `tag` (empty data from whichever rank),
    /// in the stream's order; the host does not wait.
    pub fn expect_signal(self: &Arc<Self>, stream: &Stream, tag: u64) -> Result<(), BackendError> {
        let arrived = Event::new(stream.device(), stream.device_name());
        let value = arrived.record_with(|_| Ok(()))?;
        stream.wait(&arrived)?;
        let node = Arc::downgrade(self);
        self.on_data(
            tag,
            Box::new(move |bytes| {
                if let (Err(e), Some(node)) = (bytes, node.upgrade()) {
                    node.fail(e);
                }
                arrived.signal(value);
            }),
        );
        Ok(())
    }

    /// Sends rank `to` the signal `tag` once `event` has reached `value`, from a thread of its
    /// own (a failed or timed-out wait goes as the signal's error).
    pub fn signal_when(
        self: &Arc<Self>,
        event: Event,
        value: u64,
        to: usize,
        tag: u64,
    ) -> Result<(), BackendError> {
        let node = Arc::downgrade(self);
        self.spawn("lamina-signal", move || {
            let bytes = event
                .wait_for(value)
                .map(|()| Vec::new())
                .map_err(|e| e.to_string());
            if let Some(node) = node.upgrade()
                && let Err(e) = node.send(to, &Message::Data { tag, bytes })
            {
                node.fail(e.to_string());
            }
        })
    }

    /// Runs `put` with data `tag`, now if it has arrived, else when it does.
    fn on_data(&self, tag: u64, put: Box<dyn FnOnce(Result<Vec<u8>, String>) + Send>) {
        let mut mailbox = lock(&self.mailbox);
        match mailbox.remove(&tag) {
            Some(Mail::Arrived(bytes)) => {
                drop(mailbox);
                put(bytes);
            }
            _ => {
                mailbox.insert(tag, Mail::Expected(put));
            }
        }
    }
}
