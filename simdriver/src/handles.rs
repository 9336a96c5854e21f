//! NVML's opaque handles. A handle names what it points at (a GPU, a MIG device, a GPU
//! or compute instance, an event set) in its bits, so no memory backs it, a stale handle
//! is detected by looking the object up, and nothing leaks however many a client asks
//! for. NVML's clients never dereference handles.

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handle {
    /// A physical GPU, by index.
    Gpu(u32),
    /// The MIG device of compute instance `ci` of GPU instance `gi`.
    MigDevice {
        /// GPU index.
        gpu: u32,
        /// GPU-instance id.
        gi: u32,
        /// Compute-instance id.
        ci: u32,
    },
    /// A GPU instance.
    GpuInstance {
        /// GPU index.
        gpu: u32,
        /// GPU-instance id.
        gi: u32,
    },
    /// A compute instance.
    ComputeInstance {
        /// GPU index.
        gpu: u32,
        /// GPU-instance id.
        gi: u32,
        /// Compute-instance id.
        ci: u32,
    },
    /// An event set, by number.
    EventSet(u32),
}

const TAG_SHIFT: u32 = 56;
const GPU_SHIFT: u32 = 32;
const GI_SHIFT: u32 = 16;

impl Handle {
    /// The handle as the bits of a pointer; never 0.
    pub fn encode(self) -> usize {
        let (tag, gpu, gi, ci): (u64, u32, u32, u32) = match self {
            Handle::Gpu(g) => (1, g, 0, 0),
            Handle::MigDevice { gpu, gi, ci } => (2, gpu, gi, ci),
            Handle::GpuInstance { gpu, gi } => (3, gpu, gi, 0),
            Handle::ComputeInstance { gpu, gi, ci } => (4, gpu, gi, ci),
            Handle::EventSet(n) => (5, n, 0, 0),
        };
        let bits = (tag << TAG_SHIFT)
            | (u64::from(gpu & 0xff_ffff) << GPU_SHIFT)
            | (u64::from(gi & 0xffff) << GI_SHIFT)
            | u64::from(ci & 0xffff);
        bits as usize
    }

    /// The handle a pointer's bits name; `None` for anything this driver did not hand out.
    pub fn decode(bits: usize) -> Option<Self> {
        let bits = bits as u64;
        let gpu = ((bits >> GPU_SHIFT) & 0xff_ffff) as u32;
        let gi = ((bits >> GI_SHIFT) & 0xffff) as u32;
        let ci = (bits & 0xffff) as u32;
        Some(match bits >> TAG_SHIFT {
            1 => Handle::Gpu(gpu),
            2 => Handle::MigDevice { gpu, gi, ci },
            3 => Handle::GpuInstance { gpu, gi },
            4 => Handle::ComputeInstance { gpu, gi, ci },
            5 => Handle::EventSet(gpu),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_handle_survives_the_round_trip_and_none_is_null() {
        let all = [
            Handle::Gpu(0),
            Handle::Gpu(7),
            Handle::MigDevice {
                gpu: 3,
                gi: 14,
                ci: 0,
            },
            Handle::GpuInstance { gpu: 1, gi: 1 },
            Handle::ComputeInstance {
                gpu: 7,
                gi: 13,
                ci: 2,
            },
            Handle::EventSet(42),
        ];
        for h in all {
            assert_ne!(h.encode(), 0);
            assert_eq!(Handle::decode(h.encode()), Some(h));
        }
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(0x1234), None);
    }
}
