#[test]
fn samples() {
    let mut fails = 0;
    for e in ["/work/main/hlo/tests/text_samples", "/work/main/hlo/tests/fixtures", "/work/main/hlo-tests/cases", "/work/main/examples"].iter().flat_map(|d| std::fs::read_dir(d).unwrap()) {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "hlo") { continue; }
        let src = std::fs::read_to_string(&p).unwrap();
        match hlo::text::parse(&p.display().to_string(), &src) {
            Ok(m) => println!("{}: ok {} comps {} instrs", p.display(), m.comps.len(), m.instrs.len()),
            Err(e) => { fails += 1; println!("{e}") }
        }
    }
    assert_eq!(fails, 0);
}
