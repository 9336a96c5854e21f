//! The simulator's errors as NVML return codes, so the NVML backend's own error mapping
//! is what turns them back into Tessera's kinds.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::*;
use tessera_gpu::backend::{BackendError, ErrorKind};

/// An NVML return code.
pub type Code = nvmlReturn_t;

/// `NVML_SUCCESS`.
pub const SUCCESS: Code = nvmlReturn_enum_NVML_SUCCESS;
/// `NVML_ERROR_UNINITIALIZED`.
pub const UNINITIALIZED: Code = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const INVALID_ARGUMENT: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
/// `NVML_ERROR_NO_PERMISSION`.
pub const NO_PERMISSION: Code = nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
/// `NVML_ERROR_NOT_FOUND`.
pub const NOT_FOUND: Code = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub const INSUFFICIENT_SIZE: Code = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
/// `NVML_ERROR_DRIVER_NOT_LOADED`.
pub const DRIVER_NOT_LOADED: Code = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
/// `NVML_ERROR_TIMEOUT`.
pub const TIMEOUT: Code = nvmlReturn_enum_NVML_ERROR_TIMEOUT;
/// `NVML_ERROR_GPU_IS_LOST`.
pub const GPU_IS_LOST: Code = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
/// `NVML_ERROR_RESET_REQUIRED`.
pub const RESET_REQUIRED: Code = nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
/// `NVML_ERROR_IN_USE`.
pub const IN_USE: Code = nvmlReturn_enum_NVML_ERROR_IN_USE;
/// `NVML_ERROR_INSUFFICIENT_RESOURCES`.
pub const INSUFFICIENT_RESOURCES: Code = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`.
pub const ARGUMENT_VERSION_MISMATCH: Code = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
/// `NVML_ERROR_UNKNOWN`.
pub const UNKNOWN: Code = nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// The code NVML answers for what the simulator refused. Kinds no NVML call produces
/// (an unreadable state file, an injected fault) are `NVML_ERROR_UNKNOWN`, NVML's answer
/// for a driver failure it cannot name.
pub fn of_kind(kind: &ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound(_) => NOT_FOUND,
        ErrorKind::InsufficientResources(_) => INSUFFICIENT_RESOURCES,
        // The geometry refuses a start the profile does not have, or a profile the GPU
        // does not have: an argument NVML rejects.
        ErrorKind::Placement(_) | ErrorKind::InvalidArgument(_) => INVALID_ARGUMENT,
        ErrorKind::InUse(_) => IN_USE,
        ErrorKind::NotSupported(_) => NOT_SUPPORTED,
        ErrorKind::NoPermission(_) => NO_PERMISSION,
        ErrorKind::Driver(e) => of_nvml(e),
        _ => UNKNOWN,
    }
}

/// [`of_kind`] of a backend error.
pub fn of(err: &BackendError) -> Code {
    of_kind(&err.kind)
}

fn of_nvml(e: &NvmlError) -> Code {
    use NvmlError as E;
    match e {
        E::GpuLost => GPU_IS_LOST,
        E::InUse => IN_USE,
        E::NotSupported => NOT_SUPPORTED,
        E::InvalidArg => INVALID_ARGUMENT,
        E::NotFound => NOT_FOUND,
        E::ResetRequired => RESET_REQUIRED,
        E::Timeout => TIMEOUT,
        E::UnexpectedVariant(code) => *code,
        _ => UNKNOWN,
    }
}

/// `nvmlErrorString`: NVML's own descriptions.
pub fn describe(code: Code) -> &'static std::ffi::CStr {
    match code {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NO_PERMISSION => c"Insufficient Permissions",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        TIMEOUT => c"Timeout",
        GPU_IS_LOST => c"GPU is lost",
        RESET_REQUIRED => c"GPU requires reset",
        IN_USE => c"In use by another client",
        INSUFFICIENT_RESOURCES => c"Insufficient resources",
        ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusals_the_plugin_acts_on_keep_their_nvml_codes() {
        assert_eq!(
            of_kind(&ErrorKind::InsufficientResources("taken".into())),
            INSUFFICIENT_RESOURCES
        );
        assert_eq!(of_kind(&ErrorKind::InUse("busy".into())), IN_USE);
        assert_eq!(
            of_kind(&ErrorKind::NotSupported("no".into())),
            NOT_SUPPORTED
        );
        assert_eq!(of_kind(&ErrorKind::Driver(NvmlError::GpuLost)), GPU_IS_LOST);
        assert_eq!(of_kind(&ErrorKind::Injected("boom".into())), UNKNOWN);
    }
}
