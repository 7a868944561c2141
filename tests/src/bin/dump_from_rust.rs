//! A Rust fixture for the dump tests: writes `rust.out` with `mslprof_control::dump`, then one snapshot at
//! the usual path, pausing and resuming profiling in between; prints what each call returned.

fn main() {
    let named = mslprof_control::dump(Some(std::path::Path::new("rust.out")));
    println!("runtime {}", mslprof_control::runtime_present());
    println!("named {:?}", named.map_err(|e| e.kind()));
    println!("pause {}", mslprof_control::set_profiling(false));
    println!("resume {}", mslprof_control::set_profiling(true));
    let usual = mslprof_control::dump(None);
    println!("usual {:?}", usual.map_err(|e| e.kind()));
}
