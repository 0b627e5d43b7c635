//! libibverbs' private version node `IBVERBS_PRIVATE_34`: the calls rdma-core's provider
//! libraries (`libmlx5`, `libefa`, `/usr/lib/x86_64-linux-gnu/libibverbs/*-rdmav34.so`) import
//! from libibverbs, so that a program linking one (perftest, libfabric, UCX, pyverbs) loads
//! against the drop-in.
//!
//! A provider's constructor registers its driver (`verbs_register_driver_34`); the drop-in
//! records the name and otherwise ignores it: the only device is the simulated one, so no
//! provider ever gets a device to open, and none of the `ibv_cmd_*` helpers it would call on
//! one is served. Each of those answers its C return type's error and says so on stderr.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use crate::ffi::{refuse, unsupported};

static REGISTERED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The names of the provider drivers that registered themselves (`verbs_register_driver_34`),
/// in their order: recorded, never matched against a device.
pub fn registered_drivers() -> Vec<String> {
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The head of rdma-core's `struct verbs_device_ops`: its first member names the driver.
#[repr(C)]
pub struct VerbsDeviceOpsHead {
    /// `const char *name`.
    pub name: *const c_char,
}

/// `verbs_register_driver_34`, which each provider's constructor calls when it is loaded:
/// records the driver's name and leaves it unused (its devices never appear; the simulated
/// device is the only one).
///
/// # Safety
/// `ops` is NULL or points to a `struct verbs_device_ops` whose name is NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn verbs_register_driver_34(ops: *const VerbsDeviceOpsHead) {
    if ops.is_null() {
        return;
    }
    // SAFETY: the caller's ops, whose first member is the name pointer.
    let name = unsafe { (*ops).name };
    let name = if name.is_null() {
        String::from("(unnamed)")
    } else {
        // SAFETY: a non-NULL name is a C string (the provider's static driver name).
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner()).push(name);
}

/// `verbs_allow_disassociate_destroy`: libibverbs' flag (a C `bool`, which `AtomicBool` lays
/// out alike) by which a provider lets destroy calls succeed on a device that went away; set
/// by the provider, read by nothing here.
#[no_mangle]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

/// `__ioctl_final_num_attrs` (the attribute count of a chain of ioctl command buffers): no
/// command is ever built here; says so on stderr and answers the first buffer's own count.
#[no_mangle]
pub extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    refuse("__ioctl_final_num_attrs", libc::ENOSYS);
    num_attrs
}

/// `__verbs_log` (a provider's debug message, printf-style): silent, as libibverbs is unless
/// `VERBS_LOG_LEVEL` asks for the message's level; then shown on stderr unformatted (the
/// variadic arguments unread: the C convention lets the callee ignore them).
///
/// # Safety
/// `fmt` is NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn __verbs_log(_ctx: *mut c_void, level: u32, fmt: *const c_char) {
    let wanted = std::env::var("VERBS_LOG_LEVEL")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0);
    if fmt.is_null() || wanted == 0 || level > wanted {
        return;
    }
    // SAFETY: fmt is the caller's format string.
    let f = unsafe { CStr::from_ptr(fmt) }.to_string_lossy();
    eprintln!("cmsim: a provider logged: {}", f.trim_end());
}

/// The `int` helpers that answer an errno value (0 on success, as `ibv_cmd_*` do).
macro_rules! refused_errno {
    ($($name:ident),* $(,)?) => {$(
        /// Not served (no provider device exists on the simulator): returns `ENOSYS` (errno
        /// set too) and says so on stderr.
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            refuse(stringify!($name), libc::ENOSYS)
        }
    )*};
}

/// Calls returning a pointer: NULL with errno `ENOSYS`.
macro_rules! refused_ptr {
    ($($name:ident),* $(,)?) => {$(
        /// Not served (no provider device exists on the simulator): returns NULL with errno
        /// `ENOSYS` and says so on stderr.
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            unsupported(stringify!($name));
            std::ptr::null_mut()
        }
    )*};
}

/// `void` calls: nothing done, a line on stderr.
macro_rules! refused_void {
    ($($name:ident),* $(,)?) => {$(
        /// Not served (no provider device exists on the simulator): does nothing but say so on
        /// stderr (errno `ENOSYS`).
        #[no_mangle]
        pub extern "C" fn $name() {
            unsupported(stringify!($name));
        }
    )*};
}

refused_errno!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

refused_ptr!(_verbs_init_and_alloc_context, verbs_open_device);

refused_void!(verbs_set_ops, verbs_uninit_context, verbs_init_cq);

/// `ibv_read_ibdev_sysfs_file` (the length read, or -1): a provider device's sysfs files do
/// not exist here; -1 with errno `ENOSYS`, said on stderr.
#[no_mangle]
pub extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    unsupported("ibv_read_ibdev_sysfs_file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_driver_is_recorded_by_name() {
        let name = c"mlx5-test";
        let ops = VerbsDeviceOpsHead { name: name.as_ptr() };
        // SAFETY: ops is a live head whose name is a C string.
        unsafe { verbs_register_driver_34(&ops) };
        // SAFETY: NULL is allowed and ignored.
        unsafe { verbs_register_driver_34(std::ptr::null()) };
        let names = registered_drivers();
        assert_eq!(names.iter().filter(|n| *n == "mlx5-test").count(), 1, "{names:?}");
    }

    #[test]
    fn a_helper_answers_enosys() {
        assert_eq!(ibv_cmd_alloc_pd(), libc::ENOSYS);
        assert!(verbs_open_device().is_null());
        assert_eq!(ibv_read_ibdev_sysfs_file(), -1);
        assert_eq!(__ioctl_final_num_attrs(3, std::ptr::null_mut()), 3);
    }
}
