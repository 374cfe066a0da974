//! Unit tests of `hlo::proto` (included by path from src/proto.rs).

use super::extra::{AxisRef, Mesh, MeshAxesList, MeshAxis, SubAxis};
use super::mesh_axes_groups;

fn mesh(sizes: &[i64], device_ids: Vec<i64>) -> Mesh {
    let axes = sizes.iter().enumerate().map(|(i, &size)| MeshAxis { name: format!("a{i}"), size }).collect();
    Mesh { axes, device_ids, iota_transform: None }
}

fn axis(i: i64) -> AxisRef {
    AxisRef { mesh_axis_index: i, sub_axis_info: None }
}

fn sub(i: i64, pre_size: i64, size: i64) -> AxisRef {
    AxisRef { mesh_axis_index: i, sub_axis_info: Some(SubAxis { pre_size, size }) }
}

fn groups(m: Mesh, axes: Vec<AxisRef>) -> Vec<Vec<i64>> {
    mesh_axes_groups(&MeshAxesList { mesh: Some(m), axes }).unwrap().groups().unwrap()
}

#[test]
fn mesh_axes_replica_groups() {
    // mesh x=2, y=4 (device d at x = d / 4, y = d % 4).
    assert_eq!(groups(mesh(&[2, 4], vec![]), vec![axis(1)]), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(groups(mesh(&[2, 4], vec![]), vec![axis(0)]), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert_eq!(groups(mesh(&[2, 4], vec![]), vec![axis(0), axis(1)]), vec![(0..8).collect::<Vec<_>>()]);
    // Sub-axes of an 8-device axis: (1)2 is the major factor of 2, (4)2 the minor one.
    assert_eq!(groups(mesh(&[8], vec![]), vec![sub(0, 1, 2)]), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert_eq!(groups(mesh(&[8], vec![]), vec![sub(0, 1, 2), sub(0, 4, 2)]), vec![vec![0, 1, 4, 5], vec![2, 3, 6, 7]]);
    assert_eq!(groups(mesh(&[8], vec![]), vec![sub(0, 2, 2)]), vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
    // Axes listed out of mesh order keep the listed order: over ('z','y') of x=2,y=2,z=2,
    // z is the major axis of the group (devices 0, 2, 1, 3), which JAX's shard_map and
    // XLA:CPU both use (psum_scatter over ("z","y") hands shard 1 to device 2).
    assert_eq!(groups(mesh(&[2, 2, 2], vec![]), vec![axis(2), axis(1)]), vec![vec![0, 2, 1, 3], vec![4, 6, 5, 7]]);
    assert_eq!(groups(mesh(&[2, 4], vec![]), vec![axis(1), axis(0)]), vec![vec![0, 4, 1, 5, 2, 6, 3, 7]]);
    assert_eq!(groups(mesh(&[2, 2, 2], vec![]), vec![axis(2), axis(0), axis(1)]), vec![vec![0, 2, 4, 6, 1, 3, 5, 7]]);
    // Sub-axes of one axis listed minor first.
    assert_eq!(groups(mesh(&[8], vec![]), vec![sub(0, 4, 2), sub(0, 1, 2)]), vec![vec![0, 4, 1, 5], vec![2, 6, 3, 7]]);
    // Explicit device order: groups name devices, not mesh positions.
    assert_eq!(groups(mesh(&[2, 2], vec![3, 2, 1, 0]), vec![axis(1)]), vec![vec![3, 2], vec![1, 0]]);
    // An iota transform: devices [[0, 2], [1, 3]].
    let mut m = mesh(&[2, 2], vec![]);
    m.iota_transform = Some(super::extra::IotaTransform { reshape_dims: vec![2, 2], transpose_perm: vec![1, 0] });
    assert_eq!(groups(m, vec![axis(1)]), vec![vec![0, 2], vec![1, 3]]);
}

#[test]
fn windows_print_as_xla_does() {
    use pjrt_sys::protos::xla::WindowDimension;
    let dim = |size, stride, padding_low, padding_high, base_dilation| WindowDimension {
        size,
        stride,
        padding_low,
        padding_high,
        window_dilation: 1,
        base_dilation,
        window_reversal: false,
    };
    // Fields whose entries are all the default are left out.
    assert_eq!(super::window_text(&[dim(8, 1, 7, 0, 1)]), "{size=8 pad=7_0}");
    assert_eq!(
        super::window_text(&[dim(1, 1, 0, 0, 1), dim(3, 2, 1, 1, 2)]),
        "{size=1x3 stride=1x2 pad=0_0x1_1 lhs_dilate=1x2}"
    );
    assert_eq!(super::window_text(&[]), "{}");
}

#[test]
fn bad_mesh_axes_are_errors() {
    let bad = |m: Mesh, axes: Vec<AxisRef>| mesh_axes_groups(&MeshAxesList { mesh: Some(m), axes }).unwrap_err();
    assert!(bad(mesh(&[2, 4], vec![]), vec![axis(2)]).contains("out of range"));
    assert!(bad(mesh(&[0, 4], vec![]), vec![axis(1)]).contains("positive"));
    assert!(bad(mesh(&[2, 4], vec![0, 1]), vec![axis(1)]).contains("device ids"));
    assert!(bad(mesh(&[8], vec![]), vec![sub(0, 1, 16)]).contains("exceed"));
    assert!(bad(mesh(&[8], vec![]), vec![sub(0, 3, 2)]).contains("divide"));
    assert!(bad(mesh(&[8], vec![]), vec![axis(0), sub(0, 1, 2)]).contains("whole and split"));
    assert!(bad(mesh(&[1 << 20, 1 << 20], vec![]), vec![axis(0)]).contains("more than"));
    assert!(mesh_axes_groups(&MeshAxesList { mesh: None, axes: vec![] }).is_err());
}
