//! The remote-device protocol with "ranks" that are threads of this process (the same code as
//! under `mpirun`, over channels instead of MPI): a model split over devices of three ranks
//! computes exactly what one device computes; buffers, copies and events behave as local ones;
//! mismatched model files and silent ranks are typed errors.

use std::sync::Arc;

use lamina_backend::{BufferSlice, Device, copy_async};
use lamina_gguf::pull::model_for_test;
use lamina_model::{Batch, Context, ContextParams, Model, Placement, SplitMode};

mod common;
use common::{cluster, cpu};

fn logits(model: Arc<Model>, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 128,
            n_threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut batch = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 0, true);
    }
    ctx.decode(&batch).unwrap();
    let mut out: Vec<Vec<f32>> = (0..prompt.len())
        .map(|i| ctx.logits(i).unwrap().to_vec())
        .collect();
    for step in 0..steps {
        let last = out.last().unwrap();
        let t = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap() as u32;
        let mut b = Batch::default();
        b.push(t, (prompt.len() + step) as i32, 0, true);
        ctx.decode(&b).unwrap();
        out.push(ctx.last_logits().unwrap().to_vec());
    }
    out
}

fn placed(
    path: &std::path::Path,
    host: Arc<dyn Device>,
    devices: Vec<Arc<dyn Device>>,
    tensor_split: Vec<f32>,
) -> Arc<Model> {
    let placement = Placement {
        host,
        devices,
        split_mode: SplitMode::Layer,
        tensor_split,
        n_gpu_layers: None,
        main_gpu: 0,
    };
    Arc::new(Model::load_placed(path, &placement).unwrap())
}

#[test]
fn a_model_split_over_three_ranks_computes_what_one_device_computes() {
    for name in ["smollm2-135m", "gemma3-270m"] {
        let Some(path) = model_for_test(name) else {
            eprintln!("skipping: {name} unavailable");
            continue;
        };
        let prompt = [2, 504, 3458, 282, 4649, 314, 1200, 77];
        let one = cpu(1);
        let want = logits(placed(&path, one.clone(), vec![one], vec![]), &prompt, 3);
        let (host, cluster) = cluster(3);
        let mut devices = vec![host.clone()];
        devices.extend(cluster.devices());
        let names: Vec<_> = devices.iter().map(|d| d.name().to_owned()).collect();
        assert_eq!(names, ["CPU", "CPU@1", "CPU@2"]);
        for split in [vec![1.0, 1.0, 1.0], vec![1.0, 3.0, 2.0]] {
            let sent = cluster.bytes_sent();
            let got = logits(
                placed(&path, host.clone(), devices.clone(), split.clone()),
                &prompt,
                3,
            );
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name}, split {split:?}: position {i} differs from one device"
                );
            }
            // The other ranks did compute: graphs went to them.
            assert!(
                cluster.bytes_sent() - sent > 100_000,
                "{name}: nothing sent"
            );
        }
        cluster.shutdown().unwrap();
    }
}

#[test]
fn remote_buffers_copies_and_events_behave_as_local_ones() {
    let (host, cluster) = cluster(3);
    let [a, b] = [0, 1].map(|i| cluster.devices()[i].clone());
    let data: Vec<u8> = (0..=255).collect();
    let buf = |d: &Arc<dyn Device>| d.buffer_type().alloc_buffer(256).unwrap();
    let (ba, bb, bh) = (buf(&a), buf(&b), buf(&host));
    ba.write(0, &data).unwrap();
    let mut out = vec![0u8; 16];
    ba.read(100, &mut out).unwrap();
    assert_eq!(out, data[100..116]);
    // Rank 1 → rank 2 → the front, each ordered on its streams.
    let whole = BufferSlice::whole;
    copy_async(&a.stream(), &b.stream(), &whole(&ba), &whole(&bb)).unwrap();
    copy_async(&b.stream(), &host.stream(), &whole(&bb), &whole(&bh)).unwrap();
    let ev = host.new_event().unwrap();
    host.stream().record(&ev).unwrap();
    ev.synchronize().unwrap();
    assert_eq!(whole(&bh).read().unwrap(), data);
    // The front → rank 1, then an async read back through an event of rank 1.
    bh.fill(0, 256, 7).unwrap();
    copy_async(&host.stream(), &a.stream(), &whole(&bh), &whole(&ba)).unwrap();
    let remote_ev = a.new_event().unwrap();
    a.stream().record(&remote_ev).unwrap();
    remote_ev.synchronize().unwrap();
    assert!(remote_ev.is_complete());
    let read = a.stream().get_async(&whole(&ba)).unwrap();
    assert_eq!(read.wait().unwrap(), vec![7u8; 256]);
    // Out of bounds is caught before anything is sent.
    assert!(ba.write(250, &data[..16]).is_err());
    cluster.shutdown().unwrap();
}

#[test]
fn a_rank_with_another_model_file_is_refused() {
    let (Some(smol), Some(gemma)) = (
        model_for_test("smollm2-135m"),
        model_for_test("gemma3-270m"),
    ) else {
        return;
    };
    // The rank's "copy" of SmolLM2 is Gemma's file under SmolLM2's name.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join(smol.file_name().unwrap());
    std::fs::copy(&gemma, &fake).unwrap();
    let (host, cluster) = cluster(2);
    let remote = cluster.devices()[0].clone();
    let mapping: Arc<dyn lamina_backend::HostMemory> =
        Arc::new(FileBytes(std::fs::read(&smol).unwrap(), fake.clone()));
    let err = remote
        .buffer_from_host_memory(mapping)
        .unwrap_err()
        .to_string();
    assert!(err.contains("differs from rank 0's"), "{err}");
    drop(host);
    cluster.shutdown().unwrap();
}

/// A file's bytes read by the front, named as the file a rank should map.
#[derive(Debug)]
struct FileBytes(Vec<u8>, std::path::PathBuf);

impl lamina_backend::HostMemory for FileBytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn file(&self) -> Option<&std::path::Path> {
        Some(&self.1)
    }
}

#[test]
fn a_rank_refuses_allocations_beyond_its_memory() {
    let (_host, cluster) = cluster(2);
    let remote = cluster.devices()[0].clone();
    let total = remote.memory().total as usize;
    if total == 0 {
        return; // no /proc/meminfo: the rank reports no memory and cannot bound allocations
    }
    let bt = remote.buffer_type();
    // One buffer larger than the machine: refused by the rank, which keeps serving.
    let err = bt.alloc_buffer(total + 1).unwrap_err().to_string();
    assert!(err.contains("would exceed its memory"), "{err}");
    // Buffers that fit one at a time but not together: the second is refused until the
    // first is freed. (Zero pages: the rank reserves address space, nothing is touched.)
    let big = total / 8 * 5;
    let first = bt.alloc_buffer(big).unwrap();
    let err = bt.alloc_buffer(big).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{big} bytes allocated of {total}")),
        "{err}"
    );
    drop(first);
    let second = bt.alloc_buffer(big).unwrap();
    assert_eq!(second.size(), big);
    cluster.shutdown().unwrap();
}
