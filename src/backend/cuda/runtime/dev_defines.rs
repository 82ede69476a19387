//! Profiling builds only (`--features profiling`): `#define` lines put in front of kernel
//! sources, to A/B a template variant behind `#ifdef FUCINA_...` in one binary.

use crate::kernels::KernelSpec;

/// `FUCINA_DEV_DEFINES="FUCINA_A=1,FUCINA_B"`: `#define` lines put in front of the source of
/// every kernel that names the macro, before it is compiled (the PTX cache keys on the source,
/// so each set gets its own entries and other kernels keep theirs). A measurement aid for the
/// kernel author: a template variant behind `#ifdef FUCINA_...` is A/B-tested in one binary.
/// Only names of the form `FUCINA_[A-Z0-9_]+` are taken (a short name such as `A` would reach
/// every kernel whose source holds the letter); others are dropped with a warning. Unset (the
/// default), every rendered source is compiled as it is.
pub(in crate::backend::cuda) fn source_of(
    spec: &'static KernelSpec,
) -> std::borrow::Cow<'static, str> {
    static DEFINES: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    let defines = DEFINES.get_or_init(|| {
        let (ok, dropped) = parse_dev_defines(&crate::tuning::get().profiling.dev_defines);
        if !dropped.is_empty() {
            tracing::warn!(
                "FUCINA_DEV_DEFINES: ignoring {dropped:?} (names must match FUCINA_[A-Z0-9_]+)"
            );
        }
        ok
    });
    with_defines(spec.source, defines)
}

/// `FUCINA_DEV_DEFINES`'s entries as (name, `#define` line), and the entries dropped.
fn parse_dev_defines(s: &str) -> (Vec<(String, String)>, Vec<String>) {
    let (mut ok, mut dropped) = (Vec::new(), Vec::new());
    for d in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let (name, value) = d
            .split_once('=')
            .map_or((d, ""), |(k, v)| (k.trim(), v.trim()));
        let valid = name.len() > "FUCINA_".len()
            && name.starts_with("FUCINA_")
            && name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            && !value.contains('\n');
        if valid {
            ok.push((name.to_string(), format!("#define {name} {value}\n")));
        } else {
            dropped.push(d.to_string());
        }
    }
    (ok, dropped)
}

/// `source` with the `#define` lines of the `defines` whose names it holds in front.
fn with_defines(
    source: &'static str,
    defines: &[(String, String)],
) -> std::borrow::Cow<'static, str> {
    let lines: String = defines
        .iter()
        .filter(|(name, _)| source.contains(name.as_str()))
        .map(|(_, line)| line.as_str())
        .collect();
    if lines.is_empty() {
        std::borrow::Cow::Borrowed(source)
    } else {
        std::borrow::Cow::Owned(format!("{lines}{source}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fucina_names_are_defined_and_only_where_named() {
        let (ok, dropped) = parse_dev_defines(" FUCINA_X=3, A=0,FUCINA_Y ,fucina_z,FUCINA_");
        assert_eq!(
            ok,
            vec![
                ("FUCINA_X".to_string(), "#define FUCINA_X 3\n".to_string()),
                ("FUCINA_Y".to_string(), "#define FUCINA_Y \n".to_string()),
            ]
        );
        assert_eq!(dropped, vec!["A=0", "fucina_z", "FUCINA_"]);
        let src = "#ifdef FUCINA_Y\n#endif\n";
        assert_eq!(
            with_defines(src, &ok),
            "#define FUCINA_Y \n#ifdef FUCINA_Y\n#endif\n"
        );
        assert!(matches!(
            with_defines("int x;", &ok),
            std::borrow::Cow::Borrowed("int x;")
        ));
        assert!(matches!(
            with_defines(src, &[]),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
