//! The `.entry` points of the benchmark and test kernels, generated from
//! `signatures.rs`. The host's typed launches (`cuheap::kernels`) are
//! generated from the same table, so a kernel's parameters are written
//! once; a body in [`crate::bench`] or [`crate::checks`] whose parameters
//! differ from its line in the table does not compile.

use crate::spgemm::Problem;
use cuheap_core::HeapHandle;

macro_rules! signatures {
    ($(
        $(#[$doc:meta])*
        fn $module:ident::$name:ident($($arg:ident: $ty:ty),* $(,)?);
    )*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) {
            // SAFETY: the launch upholds the contract above, which is the body's.
            unsafe { crate::$module::$name($($arg),*) }
        }
    )*};
}

include!("signatures.rs");
