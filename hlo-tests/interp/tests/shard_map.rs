//! JAX shard_map modules (Shardy and GSPMD forms) against XLA's own per-device results.
//! Fixtures come from tests/data/gen_shard_map.py.
mod common;
use common::*;
use interp::{InterpError, Mode};
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn check_fixture(case: &str, n: usize) {
    for tag in ["sdy", "gspmd"] {
        let text = std::fs::read_to_string(data(&format!("{case}.{tag}.hlo"))).unwrap();
        let m = parse(&text);
        let c = cfg(n, Mode::Partition);
        let npz = runs::io::read_npz(data(&format!("{case}.{tag}.npz"))).unwrap();
        let shapes = runs::local_param_shapes(&m, &c).unwrap();
        for (i, s) in shapes[0].iter().enumerate() {
            let stored = &npz[&runs::io::param_name(i, 0)];
            assert_eq!(s.as_array().unwrap().dims, stored.shape.dims, "{case}.{tag} parameter {i}");
        }
        let args = runs::io::inputs_from_npz(&m, &c, &npz).unwrap();
        let out = interp::run(&m, &c, &args).unwrap_or_else(|e| panic!("{case}.{tag}: {e}"));
        let res_shapes = runs::local_result_shapes(&m, &c).unwrap();
        for (d, o) in out.iter().enumerate() {
            assert!(o.shape().compatible(&res_shapes[d]), "{case}.{tag}: {} vs {}", o.shape(), res_shapes[d]);
            for (j, leaf) in o.leaves().into_iter().enumerate() {
                let want = &npz[&runs::io::output_name(j, d)];
                assert_eq!(leaf.shape.dims, want.shape.dims, "{case}.{tag} o{j}_d{d}");
                let (g, w) = (leaf.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
                for (k, (a, b)) in g.iter().zip(&w).enumerate() {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{case}.{tag} o{j}_d{d}[{k}]: {a} vs {b}");
                }
            }
        }
    }
}

#[test]
fn psum_1d() {
    check_fixture("psum_1d", 4);
}

#[test]
fn mesh2d_all_gather_psum_scatter_ppermute_axis_index_all_to_all() {
    check_fixture("mesh2d", 8);
}

#[test]
fn elementwise_outside_shard_map() {
    check_fixture("outer_add", 8);
}

#[test]
fn elementwise_on_sharded_parameter() {
    check_fixture("sin_sharded", 8);
}

#[test]
fn local_param_shapes_follow_shardings() {
    let text = std::fs::read_to_string(data("mesh2d.sdy.hlo")).unwrap();
    let m = parse(&text);
    let s = runs::local_param_shapes(&m, &cfg(8, Mode::Partition)).unwrap();
    assert_eq!(s.len(), 8);
    assert_eq!(s[3][0].as_array().unwrap().dims, vec![4, 4]);
    assert_eq!(s[3][1].as_array().unwrap().dims, vec![8, 4]);
    // Replica mode ignores shardings.
    let s = runs::local_param_shapes(&m, &cfg(8, Mode::Replica)).unwrap();
    assert_eq!(s[0][0].as_array().unwrap().dims, vec![8, 16]);
}

#[test]
fn sharded_value_outside_shard_map_needs_partitioner() {
    let t = "HloModule m, num_partitions=2\nENTRY e {\n  a = f32[4,2] parameter(0), sharding={devices=[2,1]<=[2]}\n  ROOT t = f32[2,4] transpose(a), dimensions={1,0}\n}\n";
    let m = parse(t);
    let c = cfg(2, Mode::Partition);
    assert_eq!(runs::local_param_shapes(&m, &c).unwrap()[1][0].to_string(), "f32[2,2]");
    let args = vec![vec![ramp(&[2, 2], 0.0)], vec![ramp(&[2, 2], 4.0)]];
    let e = interp::run(&m, &c, &args).unwrap_err();
    assert!(
        matches!(&e, InterpError::UnsupportedOp { op, why, .. } if op == "transpose" && why.contains("SPMD partitioner")),
        "{e}"
    );
    // Elementwise on it is fine and stays local; a full-shaped constant operand is cut into shards.
    let t = "HloModule m, num_partitions=2\nENTRY e {\n  a = f32[4,2] parameter(0), sharding={devices=[2,1]<=[2]}\n  c = f32[4,2] iota(), iota_dimension=0\n  ROOT t = f32[4,2] add(a, c)\n}\n";
    let out = interp::run(&parse(t), &c, &args).unwrap();
    assert_eq!(vals::<f32>(&out[1]), vec![6., 7., 9., 10.]);
    assert_eq!(vals::<f32>(&out[0]), vec![0., 1., 3., 4.]);
}
