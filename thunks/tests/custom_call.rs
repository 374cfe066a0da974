//! `thunks::custom_call`: a call's config round-trips through the `backend_config` XLA hands
//! the handlers, bad attributes name themselves, and staging sizes follow the handlers' layout.

use std::collections::HashMap;

use hlo::analysis::ReductionKind;
use thunks::custom_call::*;
use thunks::{CollectiveKind, KernelAlgorithm};

/// Parses the dictionary `backend_config` writes, the way XLA hands it over.
struct Parsed(HashMap<String, String>);

impl Parsed {
    fn new(s: &str) -> Self {
        let inner = s.strip_prefix('{').and_then(|s| s.strip_suffix('}')).expect("braced");
        let mut m = HashMap::new();
        // Values never contain ", " followed by a key = ...; split on top-level commas.
        let mut depth = 0;
        let mut start = 0;
        let mut quoted = false;
        let bytes = inner.as_bytes();
        for i in 0..=bytes.len() {
            let c = bytes.get(i).copied();
            match c {
                // Escapes never write a quote (`\22`), so quotes toggle strings.
                Some(b'"') => quoted = !quoted,
                _ if quoted => {}
                Some(b'<') => depth += 1,
                Some(b'>') => depth -= 1,
                Some(b',') if depth > 0 => {}
                Some(b',') | None => {
                    let item = inner[start..i].trim();
                    let (k, v) = item.split_once(" = ").expect("k = v");
                    m.insert(k.to_owned(), v.to_owned());
                    start = i + 1;
                }
                _ => {}
            }
        }
        Parsed(m)
    }
}

impl AttrSource for Parsed {
    fn names(&self) -> Result<Vec<String>, String> {
        Ok(self.0.keys().cloned().collect())
    }
    fn i64(&self, name: &str) -> Result<Option<i64>, String> {
        self.0
            .get(name)
            .map(|v| v.strip_suffix(" : i64").ok_or("not an i64".to_owned())?.parse().map_err(|_| "bad i64".to_owned()))
            .transpose()
    }
    fn str(&self, name: &str) -> Result<Option<String>, String> {
        // MLIR's `\XX` escapes, as XLA decodes them.
        Ok(self.0.get(name).map(|v| {
            let b = v.trim_matches('"').as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'\\' {
                    out.push(u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap(), 16).unwrap());
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).unwrap()
        }))
    }
    fn i64_array(&self, name: &str) -> Result<Option<Vec<i64>>, String> {
        Ok(self.0.get(name).map(|v| {
            let body = v.strip_prefix("array<i64").unwrap().trim_end_matches('>');
            body.strip_prefix(": ").map_or(vec![], |b| b.split(", ").map(|x| x.parse().unwrap()).collect())
        }))
    }
}

#[test]
fn round_trips_through_backend_config() {
    let c = CustomCallConfig {
        groups: vec![vec![3, 2], vec![1, 0]],
        reduction: Some(ReductionKind::Max),
        num_devices: 4,
        instance: 77,
        timeout_ms: 10_000,
        ..CustomCallConfig::new(CollectiveKind::AllReduce, KernelAlgorithm::OneShotAllReduce, "all-reduce.2")
    };
    let s = c.backend_config();
    assert_eq!(
        s,
        "{algorithm = \"one_shot\", group_size = 2 : i64, groups = array<i64: 3, 2, 1, 0>, instance = 77 : i64, \
         name = \"all-reduce.2\", num_devices = 4 : i64, reduction = \"max\", timeout_ms = 10000 : i64}"
    );
    assert_eq!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&s)).unwrap(), c);
    // A slot travels with its staging size; a call without one reads back as before.
    let slotted = CustomCallConfig { slot: Some(12), slot_bytes: 1 << 20, slot_gpu_bytes: 3 << 20, ..c.clone() };
    let t = slotted.backend_config();
    assert!(t.contains("slot = 12 : i64, slot_bytes = 1048576 : i64, slot_gpu_bytes = 3145728 : i64"), "{t}");
    assert_eq!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&t)).unwrap(), slotted);
    // A call's block limit (beside compute) travels; 0: no attribute.
    let few = CustomCallConfig { blocks: 16, ..c.clone() };
    let b = few.backend_config();
    assert!(b.starts_with("{algorithm = \"one_shot\", blocks = 16 : i64, group_size"), "{b}");
    assert_eq!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&b)).unwrap(), few);
    // Ordering operands (XLA:CPU chains) travel; none: no attribute.
    // A fused epilogue travels exactly (its constants by their bits), only on a sum.
    let e = Epilogue {
        round_ar: Some(RoundTo::Bf16),
        norm_of_rounded: false,
        mean: Mean::Multiply((1.0f32 / 4096.0).to_bits()),
        eps: 1e-6f32.to_bits(),
        gamma: true,
    };
    assert_eq!(Epilogue::parse(&e.text()).unwrap(), e);
    let fused = CustomCallConfig { reduction: Some(ReductionKind::Sum), epilogue: Some(e), ..c.clone() };
    let text = fused.backend_config();
    assert!(text.contains("epilogue = \"rmsnorm;round=bf16;of=exact;mul=39800000;eps=358637bd;gamma=1\""), "{text}");
    assert_eq!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&text)).unwrap(), fused);
    let on_max = c
        .backend_config()
        .replace("timeout_ms", "epilogue = \"rmsnorm;round=none;of=rounded;div=45800000;eps=0;gamma=0\", timeout_ms");
    assert!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&on_max)).is_err());
    let chained = CustomCallConfig { order_operands: 2, ..c.clone() };
    let t = chained.backend_config();
    assert!(t.contains("order_operands = 2 : i64") && !s.contains("order_operands"), "{t}");
    assert_eq!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&t)).unwrap(), chained);
    assert_eq!(c.group_of(1), Some(&[1usize, 0][..]));
    assert_eq!(c.device_span(), 4);

    let p = CustomCallConfig {
        pairs: vec![(0, 1), (1, 0)],
        dimension: Some(0),
        layout: Some(vec![0, 1]),
        num_devices: 8,
        instance: 5,
        timeout_ms: 1,
        ..CustomCallConfig::new(CollectiveKind::CollectivePermute, KernelAlgorithm::DirectPermute, "cp")
    };
    let back = CustomCallConfig::from_attrs(CollectiveKind::CollectivePermute, &Parsed::new(&p.backend_config()));
    assert_eq!(back.unwrap(), p);

    // Groups across processes: each device's process travels along, never a job's token.
    let x = CustomCallConfig { processes: vec![1, 1, 0, 0], ..c.clone() };
    let s = x.backend_config();
    assert!(s.contains("processes = array<i64: 1, 1, 0, 0>") && !s.contains("job"), "{s}");
    assert!(x.spans_processes() && !c.spans_processes());
    assert_eq!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&s)).unwrap(), x);
    assert_eq!(x.process_of().get(&3), Some(&1));
    assert_eq!(x.process_of().get(&0), Some(&0));
    let short = s.replace("processes = array<i64: 1, 1, 0, 0>", "processes = array<i64: 1>");
    let e = CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&short)).unwrap_err();
    assert!(e.to_string().contains("1 processes for 4 devices"), "{e}");

    // Decisions (report lines: tabs, newlines, quotes, braces, commas, non-ASCII) survive
    // as one escaped string.
    let lines = "all-reduce\tall-reduce.2\tf32\t64\t{{3,2},{1,0}}\t1\tkernel (one-shot)\tsmall, \"fits\" \\ ok\n\
                 all-gather\tag.1\tf32\t8\t{{0}}\t0\tfallback\tno peer access 0↔2\n";
    let y = CustomCallConfig { decisions: lines.into(), ..c.clone() };
    let s = y.backend_config();
    assert!(!s.contains('\t') && !s.contains('\n') && s.contains("decisions = \"all-reduce\\09"), "{s}");
    assert_eq!(CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&s)).unwrap(), y);
    let old = s.replace("{algorithm", "{job = \"0123abcd\", algorithm");
    let e = CustomCallConfig::from_attrs(CollectiveKind::AllReduce, &Parsed::new(&old)).unwrap_err();
    assert!(e.to_string().contains("unknown attribute 'job'"), "{e}");
}

#[test]
fn bad_attributes_name_themselves() {
    let ok = "{algorithm = \"one_shot\", group_size = 2 : i64, groups = array<i64: 0, 1>, instance = 1 : i64, \
              reduction = \"sum\", timeout_ms = 5 : i64}";
    let kind = CollectiveKind::AllReduce;
    assert!(CustomCallConfig::from_attrs(kind, &Parsed::new(ok)).is_ok());
    let e = CustomCallConfig::from_attrs(kind, &Parsed::new(&ok.replace("one_shot", "zig"))).unwrap_err();
    assert_eq!(e.to_string(), "attribute 'algorithm': unknown algorithm 'zig'");
    let e = CustomCallConfig::from_attrs(kind, &Parsed::new(&ok.replace("group_size = 2", "group_size = 3")));
    assert!(e.unwrap_err().to_string().contains("do not split into groups of 3"));
    let no_red = ok.replace(", reduction = \"sum\"", "");
    assert_eq!(CustomCallConfig::from_attrs(kind, &Parsed::new(&no_red)).unwrap_err(), AttrError::Missing("reduction"));
    assert_eq!(target_kind("peerless.all_gather"), Some(CollectiveKind::AllGather));
    assert_eq!(target_name(CollectiveKind::RaggedAllToAll), None);
}

#[test]
fn host_staging_puts_each_operand_on_its_own_cache_line() {
    assert_eq!(CustomCallConfig::host_staging_bytes(&[]), 0);
    assert_eq!(CustomCallConfig::host_staging_bytes(&[1, 64, 65]), 64 + 64 + 128);
    assert_eq!(host_stage_len(usize::MAX), usize::MAX, "saturates, never wraps");
}

#[test]
fn gpu_staging_follows_the_handlers_layout() {
    let base = CustomCallConfig {
        groups: vec![vec![0, 1, 2, 3]],
        reduction: Some(ReductionKind::Sum),
        dimension: Some(0),
        num_devices: 4,
        instance: 1,
        timeout_ms: 1,
        ..CustomCallConfig::new(CollectiveKind::AllReduce, KernelAlgorithm::OneShotAllReduce, "x")
    };
    let with = |kind, algorithm| CustomCallConfig { kind, algorithm, ..base.clone() };
    use CollectiveKind as K;
    use KernelAlgorithm as A;
    // One-shot: both halves hold every operand side by side, each rounded to 256.
    assert_eq!(base.gpu_staging_bytes(&[1000, 10], &[1000, 10]), 2 * (1024 + 256));
    // Two-shot and reduce-scatter: the largest operand per half.
    assert_eq!(with(K::AllReduce, A::TwoShotAllReduce).gpu_staging_bytes(&[1 << 20], &[1 << 20]), 2 << 20);
    assert_eq!(with(K::ReduceScatter, A::DirectReduceScatter).gpu_staging_bytes(&[4096], &[1024]), 8192);
    // Exchanges stage the whole result: an all-gather of 4 is 4x its operand.
    assert_eq!(with(K::AllGather, A::DirectAllGather).gpu_staging_bytes(&[1 << 20], &[4 << 20]), 4 << 20);
    // Tuple all-to-all: one 256-aligned chunk per member, however small its parts.
    let a2a = with(K::AllToAll, A::DirectAllToAll);
    assert_eq!(a2a.gpu_staging_bytes(&[100; 4], &[100; 4]), 4 * 256);
    assert_eq!(a2a.gpu_staging_bytes(&[300; 4], &[300; 4]), 4 * 512);
    // Always a whole number of 512-byte units (halves stay 256-aligned), never empty.
    for (args, rets) in [(vec![], vec![]), (vec![1], vec![1]), (vec![257], vec![257])] {
        let b = base.gpu_staging_bytes(&args, &rets);
        assert!(b >= 512 && b.is_multiple_of(512), "{b}");
    }
}
