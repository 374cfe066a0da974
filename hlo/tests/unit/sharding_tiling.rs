//! Unit tests of `sharding::tiling` (included by path from src/sharding/tiling.rs).

use super::*;

#[test]
fn parse_shardy_values() {
    let v =
        parse_values(r#"#sdy.sharding_per_value<[<@mesh, [{\"a\"}, {\"b\"}]>, <@mesh, [{}, {"b", "a"}]>]>"#).unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].1, vec![vec!["a".to_string()], vec!["b".to_string()]]);
    assert_eq!(v[1].1, vec![vec![], vec!["b".to_string(), "a".to_string()]]);
    let m = parse_mesh(r#"["a"=2, "b"=4], device_ids=[7,6,5,4,3,2,1,0]"#).unwrap();
    assert_eq!(m, vec![("a".to_string(), 2), ("b".to_string(), 4)]);
    let t = tiling_from_mesh(&m, &v[1].1, 8).unwrap();
    assert_eq!(t.counts, vec![1, 8]);
}

#[test]
fn unreduced_axes_are_an_error_reduced_ones_are_not() {
    let e = parse_values(r#"#sdy.sharding_per_value<[<@mesh, [], unreduced={"y"}>]>"#).unwrap_err();
    assert!(e.contains(r#"unreduced axes {"y"}"#), "{e}");
    let v = parse_values(r#"#sdy.sharding<@mesh, [{"x"}, {}], reduced={"y"}>"#).unwrap();
    assert_eq!(v[0].1, vec![vec!["x".to_string()], vec![]]);
}
