//! libvirt's bulk stats of one domain (`virDomainListGetStats`), read out of libvirt's typed
//! parameters into plain Rust values. The `virt` crate's `all_domain_stats` hands back raw
//! records it never frees and asks for every domain; this asks for one and frees what it got.

use std::ffi::CStr;
use std::os::raw::c_char;

use virt::domain::Domain;
use virt::sys;

/// The value of one typed parameter, as libvirt typed it (`int` and `long long` are both
/// signed, `uint` and `unsigned long long` both unsigned).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TypedValue {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    String(String),
}

/// One domain's bulk stats: its UUID and libvirt's parameters (`cpu.time`, `vcpu.0.state`...)
/// in libvirt's order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DomainStats {
    pub uuid: String,
    pub params: Vec<(String, TypedValue)>,
}

/// A domain with a few devices has some hundreds of parameters; a count far above that is not
/// a record we read.
const MAX_PARAMS: usize = 65_536;

/// The groups KubeVirt's launcher asks for: state, cpu-total, balloon, vcpu, interface, block.
pub(crate) const STATS: u32 = sys::VIR_DOMAIN_STATS_STATE
    | sys::VIR_DOMAIN_STATS_CPU_TOTAL
    | sys::VIR_DOMAIN_STATS_BALLOON
    | sys::VIR_DOMAIN_STATS_VCPU
    | sys::VIR_DOMAIN_STATS_INTERFACE
    | sys::VIR_DOMAIN_STATS_BLOCK;

/// The bulk stats of `dom`. NOWAIT: a stat that needs the domain's job (balloon, block) is
/// skipped while another job holds it (a long attach), rather than making a poll wait for it.
pub(crate) fn domain_stats(dom: &Domain) -> Result<DomainStats, virt::error::Error> {
    let uuid = dom.uuid_string()?;
    // SAFETY: `dom` is valid for the call; the list is null-terminated as libvirt requires.
    let mut doms = [unsafe { dom.as_ptr() }, std::ptr::null_mut()];
    let mut records: *mut sys::virDomainStatsRecordPtr = std::ptr::null_mut();
    // SAFETY: `doms` is a null-terminated array of valid domain pointers; `records` is a valid
    // out-pointer that libvirt fills with a list we free below.
    let n = unsafe {
        sys::virDomainListGetStats(
            doms.as_mut_ptr(),
            STATS,
            &mut records,
            sys::VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT,
        )
    };
    if n < 0 {
        return Err(virt::error::Error::last_error());
    }
    let mut params = Vec::new();
    if n > 0 && !records.is_null() {
        // SAFETY: libvirt returned `n` > 0 records, so the first entry is a valid record whose
        // `params` holds `nparams` parameters; all of it lives until the list is freed.
        unsafe {
            let record = &**records;
            let count = usize::try_from(record.nparams).unwrap_or(0).min(MAX_PARAMS);
            if !record.params.is_null() {
                for p in std::slice::from_raw_parts(record.params, count) {
                    if let Some(v) = read_param(p) {
                        params.push(v);
                    }
                }
            }
        }
    }
    if !records.is_null() {
        // SAFETY: `records` is the list libvirt allocated for this call, freed once.
        unsafe { sys::virDomainStatsRecordListFree(records) };
    }
    Ok(DomainStats { uuid, params })
}

/// One typed parameter as a name and a value; `None` for a type libvirt may add later.
///
/// # Safety
///
/// `p` must be a parameter libvirt filled: a NUL-terminated field, and for a string a valid
/// (or null) C string.
unsafe fn read_param(p: &sys::virTypedParameter) -> Option<(String, TypedValue)> {
    // The field is a fixed array; libvirt terminates it, but stop at its end regardless.
    let field: Vec<u8> = p
        .field
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    let name = String::from_utf8_lossy(&field).into_owned();
    // SAFETY: `type_` says which member of the union libvirt set (every arm reads that one).
    let value = unsafe {
        match p.type_ as u32 {
            sys::VIR_TYPED_PARAM_INT => TypedValue::Int(p.value.i.into()),
            sys::VIR_TYPED_PARAM_UINT => TypedValue::UInt(p.value.ui.into()),
            sys::VIR_TYPED_PARAM_LLONG => TypedValue::Int(p.value.l),
            sys::VIR_TYPED_PARAM_ULLONG => TypedValue::UInt(p.value.ul),
            sys::VIR_TYPED_PARAM_DOUBLE => TypedValue::Float(p.value.d),
            sys::VIR_TYPED_PARAM_BOOLEAN => TypedValue::Bool(p.value.b != 0),
            sys::VIR_TYPED_PARAM_STRING => {
                let s: *const c_char = p.value.s;
                if s.is_null() {
                    TypedValue::String(String::new())
                } else {
                    TypedValue::String(CStr::from_ptr(s).to_string_lossy().into_owned())
                }
            }
            _ => return None,
        }
    };
    Some((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(
        name: &[u8],
        type_: u32,
        value: sys::_virTypedParameter__bindgen_ty_1,
    ) -> sys::virTypedParameter {
        let mut field = [0 as c_char; 80];
        for (f, b) in field.iter_mut().zip(name) {
            *f = *b as c_char;
        }
        sys::virTypedParameter {
            field,
            type_: type_ as i32,
            value,
        }
    }

    #[test]
    fn typed_parameters_read_as_libvirt_typed_them() {
        type V = sys::_virTypedParameter__bindgen_ty_1;
        let text = std::ffi::CString::new("vda").unwrap();
        let cases = [
            (
                param(b"vcpu.0.state", sys::VIR_TYPED_PARAM_INT, V { i: -1 }),
                Some(TypedValue::Int(-1)),
            ),
            (
                param(b"net.count", sys::VIR_TYPED_PARAM_UINT, V { ui: 2 }),
                Some(TypedValue::UInt(2)),
            ),
            (
                param(b"x", sys::VIR_TYPED_PARAM_LLONG, V { l: i64::MIN }),
                Some(TypedValue::Int(i64::MIN)),
            ),
            (
                param(b"cpu.time", sys::VIR_TYPED_PARAM_ULLONG, V { ul: u64::MAX }),
                Some(TypedValue::UInt(u64::MAX)),
            ),
            (
                param(b"d", sys::VIR_TYPED_PARAM_DOUBLE, V { d: 0.5 }),
                Some(TypedValue::Float(0.5)),
            ),
            (
                param(b"b", sys::VIR_TYPED_PARAM_BOOLEAN, V { b: 1 }),
                Some(TypedValue::Bool(true)),
            ),
            (
                param(
                    b"block.0.name",
                    sys::VIR_TYPED_PARAM_STRING,
                    V {
                        s: text.as_ptr() as *mut c_char,
                    },
                ),
                Some(TypedValue::String("vda".into())),
            ),
            (
                param(
                    b"s",
                    sys::VIR_TYPED_PARAM_STRING,
                    V {
                        s: std::ptr::null_mut(),
                    },
                ),
                Some(TypedValue::String(String::new())),
            ),
            (param(b"new", 99, V { ul: 0 }), None),
        ];
        for (p, want) in cases {
            // SAFETY: each parameter is built as libvirt fills one; the string outlives the loop.
            let got = unsafe { read_param(&p) };
            let name = String::from_utf8_lossy(
                &p.field
                    .iter()
                    .take_while(|c| **c != 0)
                    .map(|c| *c as u8)
                    .collect::<Vec<_>>(),
            )
            .into_owned();
            assert_eq!(got, want.map(|v| (name, v)));
        }
    }

    /// A field libvirt failed to terminate is read to its end, not past it.
    #[test]
    fn an_unterminated_field_stops_at_its_end() {
        let p = param(
            &[b'a'; 80],
            sys::VIR_TYPED_PARAM_UINT,
            sys::_virTypedParameter__bindgen_ty_1 { ui: 1 },
        );
        // SAFETY: the parameter is a valid uint; only its field lacks the NUL.
        let (name, _) = unsafe { read_param(&p) }.unwrap();
        assert_eq!(name, "a".repeat(80));
    }
}
