//! Unit tests of `kernels::host::layout` (included by path from src/host/layout.rs).

use super::*;
use hlo::PrimitiveType;

#[test]
fn blocks_along_inner_dimensions_are_strided() {
    let shape = ArrayShape::new(PrimitiveType::F32, vec![2, 4, 3]);
    let s = Split::new(&shape, 1, 96).unwrap();
    assert_eq!(s.whole(), Runs { offset: 0, rows: 2, row: 48, stride: 48 });
    assert_eq!(s.block(2, 1), Runs { offset: 24, rows: 2, row: 24, stride: 48 });
    assert_eq!(s.block_dense(2), Runs { offset: 0, rows: 2, row: 24, stride: 24 });
    assert_eq!(s.gathered(3, 2), Runs { offset: 96, rows: 2, row: 48, stride: 144 });
    assert!(s.check_blocks(3, &shape, 1).is_err());
    assert!(Split::new(&shape, 3, 96).is_err());
    assert!(Split::new(&shape, 0, 95).is_err());
}
