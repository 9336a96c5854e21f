//! Giving a copy of a shared object another `SONAME`, so one build serves as several of
//! the driver's libraries: the simulated `libcuda.so.1` is the NVML library's code (one
//! crate, one cdylib, both sets of entry points) with `libcuda.so.1` as its name, and the
//! driver's other libraries are one tiny stub under each of their names.
//!
//! The name is rewritten in place in `.dynstr`, so the new one must not be longer than the
//! one the linker wrote. A linker may share a string's tail between names (`libfoo.so.1`
//! and `foo.so.1` stored once); rewriting a shared tail would rename another entry too, so
//! every reference into `.dynstr` is checked first and such an object refused.

use object::{
    Endianness,
    elf::{self, FileHeader64},
    read::elf::{Dyn, FileHeader, SectionHeader},
};

/// Why a shared object's name could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum SonameError {
    /// Not an ELF64 shared object we can read.
    #[error("not a readable ELF64 object")]
    Parse(#[source] object::Error),
    /// It has no dynamic section or no `DT_SONAME`.
    #[error("the object has no SONAME to replace (link it with -Wl,-soname,…)")]
    NoSoname,
    /// The new name does not fit where the old one is.
    #[error("the SONAME {new:?} is longer than the object's {old:?}")]
    TooLong {
        /// The name asked for.
        new: String,
        /// The one in the object.
        old: String,
    },
    /// Another entry shares bytes with the name.
    #[error("another entry of .dynstr shares bytes with the SONAME {0:?}")]
    Shared(String),
}

/// The `SONAME` of a shared object, if it has one.
pub fn soname(data: &[u8]) -> Result<Option<String>, SonameError> {
    Ok(locate(data)?.map(|l| l.name))
}

/// A copy of `data` whose `SONAME` is `new`.
pub fn with_soname(data: &[u8], new: &str) -> Result<Vec<u8>, SonameError> {
    let found = locate(data)?.ok_or(SonameError::NoSoname)?;
    if new.len() > found.name.len() || new.contains('\0') {
        return Err(SonameError::TooLong {
            new: new.into(),
            old: found.name,
        });
    }
    let (start, end) = (
        found.name_offset,
        found.name_offset + found.name.len() as u64,
    );
    if found.refs.iter().any(|&r| r > start && r <= end) {
        return Err(SonameError::Shared(found.name));
    }
    let mut out = data.to_vec();
    let at =
        usize::try_from(found.dynstr_file_offset + start).map_err(|_| SonameError::NoSoname)?;
    let slot = &mut out[at..at + found.name.len()];
    slot.fill(0);
    slot[..new.len()].copy_from_slice(new.as_bytes());
    Ok(out)
}

struct Located {
    name: String,
    /// Offset of the name in `.dynstr`.
    name_offset: u64,
    dynstr_file_offset: u64,
    /// Every other offset into `.dynstr` the object uses.
    refs: Vec<u64>,
}

fn locate(data: &[u8]) -> Result<Option<Located>, SonameError> {
    let header = FileHeader64::<Endianness>::parse(data).map_err(SonameError::Parse)?;
    let endian = header.endian().map_err(SonameError::Parse)?;
    let sections = header.sections(endian, data).map_err(SonameError::Parse)?;
    // The dynamic entries and the index of the string table they use.
    let Some((dynamic, dynstr_index)) =
        sections.dynamic(endian, data).map_err(SonameError::Parse)?
    else {
        return Ok(None);
    };
    let dynstr = sections.section(dynstr_index).map_err(SonameError::Parse)?;
    let strings = sections
        .strings(endian, data, dynstr_index)
        .map_err(SonameError::Parse)?;
    let mut soname = None;
    let mut refs = Vec::new();
    for d in dynamic {
        if !d.is_string(endian) {
            continue;
        }
        let off = d.d_val(endian);
        if d.d_tag(endian) == elf::DT_SONAME {
            soname = Some(off);
        } else {
            refs.push(off);
        }
    }
    let Some(name_offset) = soname else {
        return Ok(None);
    };
    let symbols = sections
        .symbols(endian, data, elf::SHT_DYNSYM)
        .map_err(SonameError::Parse)?;
    refs.extend(symbols.iter().map(|s| u64::from(s.st_name.get(endian))));
    if let Some((mut defs, _)) = sections
        .gnu_verdef(endian, data)
        .map_err(SonameError::Parse)?
    {
        while let Some((_, mut aux)) = defs.next().map_err(SonameError::Parse)? {
            while let Some(a) = aux.next().map_err(SonameError::Parse)? {
                refs.push(u64::from(a.vda_name.get(endian)));
            }
        }
    }
    if let Some((mut needs, _)) = sections
        .gnu_verneed(endian, data)
        .map_err(SonameError::Parse)?
    {
        while let Some((need, mut aux)) = needs.next().map_err(SonameError::Parse)? {
            refs.push(u64::from(need.vn_file.get(endian)));
            while let Some(a) = aux.next().map_err(SonameError::Parse)? {
                refs.push(u64::from(a.vna_name.get(endian)));
            }
        }
    }
    let name = strings
        .get(u32::try_from(name_offset).map_err(|_| SonameError::NoSoname)?)
        .map_err(|()| SonameError::NoSoname)?;
    Ok(Some(Located {
        name: String::from_utf8_lossy(name).into_owned(),
        name_offset,
        dynstr_file_offset: dynstr.sh_offset(endian),
        refs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stub_gets_each_name_and_a_longer_one_is_refused() {
        let stub = crate::libraries::STUB;
        let old = soname(stub).unwrap().expect("the stub has a SONAME");
        let renamed = with_soname(stub, "libnvidia-ptxjitcompiler.so.1").unwrap();
        assert_eq!(renamed.len(), stub.len());
        assert_eq!(
            soname(&renamed).unwrap().as_deref(),
            Some("libnvidia-ptxjitcompiler.so.1")
        );
        let long = "x".repeat(old.len() + 1);
        assert!(matches!(
            with_soname(stub, &long),
            Err(SonameError::TooLong { .. })
        ));
        assert!(matches!(soname(b"not elf"), Err(SonameError::Parse(_))));
    }
}
