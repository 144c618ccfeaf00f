#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moat_fuzz_targets::typed_values(data));
