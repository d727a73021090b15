//! The GPUs a worker may use: `CUDA_VISIBLE_DEVICES` read as CUDA reads it, else what
//! `nvidia-smi` lists, each described (name, memory) where `nvidia-smi` can be matched to it.

use std::process::Command;
use std::time::Duration;

use super::Gpu;
use super::command::{CommandFailure, run_with_deadline};

/// How long `nvidia-smi` may run before it is killed and the machine is taken to have no GPU.
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// One GPU as `nvidia-smi` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SmiGpu {
    index: u32,
    uuid: Option<String>,
    name: Option<String>,
    /// Bytes.
    memory: Option<u64>,
}

impl SmiGpu {
    fn into_gpu(self) -> Gpu {
        Gpu {
            id: self.uuid.unwrap_or_else(|| self.index.to_string()),
            name: self.name,
            memory: self.memory,
        }
    }
}

/// `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`
/// (memory in MiB); lines that do not fit are skipped.
fn parse_nvidia_smi(text: &str) -> Vec<SmiGpu> {
    let known = |value: &str| !value.is_empty() && !value.starts_with('[');
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [index, uuid, name, memory] = fields.as_slice() else {
                return None;
            };
            Some(SmiGpu {
                index: index.parse().ok()?,
                uuid: (uuid.starts_with("GPU-") || uuid.starts_with("MIG-"))
                    .then(|| (*uuid).to_owned()),
                name: known(name).then(|| (*name).to_owned()),
                memory: memory
                    .parse::<u64>()
                    .ok()
                    .and_then(|mib| mib.checked_mul(1 << 20)),
            })
        })
        .collect()
}

/// The devices of `CUDA_VISIBLE_DEVICES`, read as CUDA does: entries up to the first that is
/// not an index, `GPU-<uuid>` or `MIG-<uuid>`, so `""`, `-1` and `NoDevFiles` mean none.
/// A repeated entry is kept once.
fn parse_cuda_visible_devices(text: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for entry in text.split(',').map(str::trim) {
        let index = !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit());
        let uuid = entry.len() > 4 && (entry.starts_with("GPU-") || entry.starts_with("MIG-"));
        if !index && !uuid {
            break;
        }
        if !ids.iter().any(|id| id == entry) {
            ids.push(entry.to_owned());
        }
    }
    ids
}

/// The GPUs to offer: `CUDA_VISIBLE_DEVICES` when set (described by `query` where it can
/// be matched), else what `query` finds.
pub(super) fn resolve_gpus(
    visible: Option<&str>,
    pci_order: bool,
    query: impl FnOnce() -> Vec<SmiGpu>,
) -> Vec<Gpu> {
    let Some(visible) = visible else {
        return query().into_iter().map(SmiGpu::into_gpu).collect();
    };
    let entries = parse_cuda_visible_devices(visible);
    if entries.iter().all(|id| id.starts_with("MIG-")) {
        // Nothing nvidia-smi lists could describe them.
        return entries.into_iter().map(undescribed_gpu).collect();
    }
    let known = query();
    // CUDA numbers devices fastest first unless told PCI order, and nvidia-smi in PCI
    // order: an index names the same GPU in both only then, or when all GPUs are alike.
    let by_index = pci_order
        || known.first().is_some_and(|first| {
            known
                .iter()
                .all(|gpu| gpu.name == first.name && gpu.memory == first.memory)
        });
    entries
        .into_iter()
        .map(|id| match describing(&id, &known, by_index) {
            Some(found) => Gpu {
                name: found.name.clone(),
                memory: found.memory,
                id,
            },
            None => undescribed_gpu(id),
        })
        .collect()
}

pub(super) fn undescribed_gpu(id: String) -> Gpu {
    Gpu {
        id,
        name: None,
        memory: None,
    }
}

/// The listed GPU that a `CUDA_VISIBLE_DEVICES` entry names: by index, or by UUID or a
/// unique UUID prefix as CUDA accepts.
fn describing<'a>(entry: &str, known: &'a [SmiGpu], by_index: bool) -> Option<&'a SmiGpu> {
    if let Ok(index) = entry.parse::<u32>() {
        return by_index
            .then(|| known.iter().find(|gpu| gpu.index == index))
            .flatten();
    }
    let mut matching = known
        .iter()
        .filter(|gpu| gpu.uuid.as_deref().is_some_and(|u| u.starts_with(entry)));
    match (matching.next(), matching.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

pub(super) fn detect_gpus() -> Vec<Gpu> {
    let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let visible = env("CUDA_VISIBLE_DEVICES");
    let pci_order = env("CUDA_DEVICE_ORDER").is_some_and(|order| order.trim() == "PCI_BUS_ID");
    resolve_gpus(visible.as_deref(), pci_order, query_nvidia_smi)
}

fn query_nvidia_smi() -> Vec<SmiGpu> {
    let mut command = Command::new("nvidia-smi");
    command.args([
        "--query-gpu=index,uuid,name,memory.total",
        "--format=csv,noheader,nounits",
    ]);
    match run_with_deadline(command, NVIDIA_SMI_TIMEOUT) {
        Ok(output) => parse_nvidia_smi(&output),
        Err(CommandFailure::NotFound) => {
            tracing::debug!("nvidia-smi is not installed; assuming no GPU");
            Vec::new()
        }
        Err(error) => {
            tracing::warn!(%error, "nvidia-smi failed; assuming no GPU");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_rows_give_gpus_with_memory_in_bytes() {
        let gpu = |index, uuid: Option<&str>, name: Option<&str>, memory| SmiGpu {
            index,
            uuid: uuid.map(Into::into),
            name: name.map(Into::into),
            memory,
        };
        let cases: Vec<(&str, Vec<SmiGpu>)> = vec![
            (
                "0, GPU-8932f937-d72c, NVIDIA H200, 143771\n1, GPU-11aa, NVIDIA H200, 143771\n",
                vec![
                    gpu(
                        0,
                        Some("GPU-8932f937-d72c"),
                        Some("NVIDIA H200"),
                        Some(143_771 << 20),
                    ),
                    gpu(
                        1,
                        Some("GPU-11aa"),
                        Some("NVIDIA H200"),
                        Some(143_771 << 20),
                    ),
                ],
            ),
            (
                "2, [N/A], , [Not Supported]",
                vec![gpu(2, None, None, None)],
            ),
            (
                "x, GPU-1, A, 1\n0, GPU-1, A\n0, GPU-1, A, 1, extra\n\n",
                vec![],
            ),
            (
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                vec![],
            ),
            ("", vec![]),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_nvidia_smi(text), expected, "{text:?}");
        }
    }

    #[test]
    fn cuda_visible_devices_is_read_as_cuda_reads_it() {
        let cases: &[(&str, &[&str])] = &[
            ("0,1", &["0", "1"]),
            (" 2 , 3 ", &["2", "3"]),
            ("GPU-8932f937,MIG-abc/1/2", &["GPU-8932f937", "MIG-abc/1/2"]),
            ("", &[]),
            ("-1", &[]),
            ("NoDevFiles", &[]),
            ("0,-1,1", &["0"]),
            ("1,,2", &["1"]),
            ("1,1,0", &["1", "0"]),
            ("GPU-", &[]),
            ("gpu0", &[]),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_cuda_visible_devices(text), *expected, "{text:?}");
        }
    }

    fn smi_gpu(index: u32, uuid: &str, name: &str) -> SmiGpu {
        SmiGpu {
            index,
            uuid: Some(uuid.into()),
            name: Some(name.into()),
            memory: Some(1 << 30),
        }
    }

    #[test]
    fn without_cuda_visible_devices_the_gpus_of_nvidia_smi_are_named_by_uuid() {
        let gpus = resolve_gpus(None, false, || {
            vec![
                smi_gpu(0, "GPU-a", "H200"),
                SmiGpu {
                    index: 1,
                    uuid: None,
                    name: None,
                    memory: None,
                },
            ]
        });
        assert_eq!(
            gpus,
            [
                Gpu {
                    id: "GPU-a".into(),
                    name: Some("H200".into()),
                    memory: Some(1 << 30)
                },
                undescribed_gpu("1".into()),
            ]
        );
        assert!(resolve_gpus(None, false, Vec::new).is_empty());
    }

    #[test]
    fn cuda_visible_devices_is_honoured_and_described_where_it_can_be_matched() {
        let alike = || vec![smi_gpu(0, "GPU-aa", "H200"), smi_gpu(1, "GPU-bb", "H200")];
        let gpus = resolve_gpus(Some("1,GPU-a,MIG-x,7"), false, alike);
        let names: Vec<_> = gpus
            .iter()
            .map(|g| (g.id.as_str(), g.name.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("1", Some("H200")),
                ("GPU-a", Some("H200")),
                ("MIG-x", None),
                ("7", None)
            ]
        );

        // Unlike GPUs: an index names a GPU of nvidia-smi only in PCI order.
        let mixed = || vec![smi_gpu(0, "GPU-aa", "A100"), smi_gpu(1, "GPU-bb", "H200")];
        assert_eq!(resolve_gpus(Some("1"), false, mixed)[0].name, None);
        assert_eq!(
            resolve_gpus(Some("1"), true, mixed)[0].name.as_deref(),
            Some("H200")
        );

        // An ambiguous UUID prefix describes nothing.
        let prefixes = || vec![smi_gpu(0, "GPU-a1", "A"), smi_gpu(1, "GPU-a2", "B")];
        assert_eq!(resolve_gpus(Some("GPU-a"), true, prefixes)[0].name, None);
    }

    #[test]
    fn an_empty_cuda_visible_devices_means_no_gpu_without_asking_nvidia_smi() {
        for text in ["", "-1", "NoDevFiles"] {
            let gpus = resolve_gpus(Some(text), false, || panic!("nvidia-smi was run"));
            assert!(gpus.is_empty(), "{text:?}");
        }
    }
}
