//! Launch-argument validation of the fused MoE decode kernels (`launch_fused.rs`).
use super::*;

fn p<T>(addr: u64, len: usize) -> DevPtr<T> {
    // SAFETY: never dereferenced (validation only).
    unsafe { DevPtr::from_raw(addr, len) }
}

fn router(q: Quant) -> MoeRouterArgs {
    let (e, k, n, top_k) = (128usize, 2048usize, 1usize, 8usize);
    let (be, bb) = weight_block(q).unwrap();
    MoeRouterArgs {
        w: p(0x10_0000, e * k / be * bb),
        x: p(0x100_0000, n * k),
        xq: p(0x200_0000, n * k),
        xds: p(0x300_0000, n * k / 16),
        logits: p(0x400_0000, n * e),
        ids: p(0x500_0000, n * top_k),
        wts: p(0x600_0000, n * top_k),
        counters: p(0x700_0000, n),
        n,
        e,
        k,
        top_k,
        norm: true,
    }
}

#[test]
fn router_norm_validation() {
    let k = 2048usize;
    let a = router(Quant::F32);
    let nm = RouterNorm {
        a: p(0x800_0000, k),
        b: p(0x900_0000, k),
        s: p(0xa00_0000, k),
        w: crate::backend::cuda::ops::elementwise::launch::NormWeightPtr::Plain(p(0xb00_0000, k)),
        eps: 1e-6,
        xq: p(0xc00_0000, k),
        xds: p(0xd00_0000, k / 16),
    };
    for q in [Quant::F32, Quant::F16, Quant::Bf16] {
        let (be, bb) = weight_block(q).unwrap();
        let r = MoeRouterArgs {
            w: p(0x10_0000, a.e * k / be * bb),
            ..a
        };
        assert!(check_router_norm(q, &r, &nm).is_ok(), "{q}");
    }
    // a Q8_0 router, two tokens, the sum over an input, a short side-car, a weight of the
    // wrong length, a misaligned b, a non-finite eps
    assert!(check_router_norm(Quant::Q8_0, &router(Quant::Q8_0), &nm).is_err());
    let two = MoeRouterArgs {
        n: 2,
        x: p(0x100_0000, 2 * k),
        logits: p(0x400_0000, 2 * a.e),
        ids: p(0x500_0000, 2 * a.top_k),
        wts: p(0x600_0000, 2 * a.top_k),
        counters: p(0x700_0000, 2),
        ..a
    };
    assert!(check_router_norm(Quant::F32, &two, &nm).is_err());
    for bad in [
        RouterNorm {
            s: p(0x800_0000 + 64, k),
            ..nm
        },
        RouterNorm {
            xds: p(0xd00_0000, k / 16 - 1),
            ..nm
        },
        RouterNorm {
            w: crate::backend::cuda::ops::elementwise::launch::NormWeightPtr::OnePlus(p(
                0xb00_0000,
                k - 32,
            )),
            ..nm
        },
        RouterNorm {
            b: p(0x900_0004, k),
            ..nm
        },
        RouterNorm {
            eps: f32::NAN,
            ..nm
        },
    ] {
        assert!(check_router_norm(Quant::F32, &a, &bad).is_err());
    }
    // k not a whole number of 32-value groups
    let odd = MoeRouterArgs {
        k: 2040,
        w: p(0x10_0000, a.e * 2040 * 4),
        ..a
    };
    assert!(check_router_norm(Quant::F32, &odd, &nm).is_err());
}

#[test]
fn router_validation() {
    for q in [Quant::F32, Quant::F16, Quant::Bf16, Quant::Q8_0] {
        assert!(check_router(q, &router(q)).is_ok(), "{q}");
    }
    assert!(check_router(Quant::Q4K, &router(Quant::Q8_0)).is_err());
    let ok = router(Quant::F32);
    // router a byte short, logits / ids / counters short, misaligned x, unaligned row width
    let short = MoeRouterArgs {
        w: p(0x10_0000, ok.w.len() - 1),
        ..ok
    };
    assert!(check_router(Quant::F32, &short).is_err());
    for bad in [
        MoeRouterArgs {
            logits: p(0x400_0000, 127),
            ..ok
        },
        MoeRouterArgs {
            ids: p(0x500_0000, 7),
            ..ok
        },
        MoeRouterArgs {
            counters: p(0x700_0000, 0),
            ..ok
        },
        MoeRouterArgs {
            x: p(0x100_0004, 2048),
            ..ok
        },
        MoeRouterArgs { top_k: 17, ..ok },
        MoeRouterArgs { e: 257, ..ok },
        MoeRouterArgs { n: 0, ..ok },
    ] {
        assert!(check_router(Quant::F32, &bad).is_err(), "{bad:?}");
    }
    // F16 rows of 2044 values are not whole 16-byte vectors; Q8_0 needs the side-car
    let f16 = router(Quant::F16);
    assert!(check_router(Quant::F16, &MoeRouterArgs { k: 2044, ..f16 }).is_err());
    let q8 = router(Quant::Q8_0);
    assert!(check_router(
        Quant::Q8_0,
        &MoeRouterArgs {
            xq: DevPtr::null(),
            ..q8
        }
    )
    .is_err());
    assert!(check_router(Quant::Q8_0, &MoeRouterArgs { k: 2040, ..q8 }).is_err());
}

/// The chunk buffer size the launcher reserves is the kernels' own `MD_SBYTES` (from the
/// rendered source of every fused gate/up and down instance), and the dynamic shared memory
/// of the manifest's warps x stages stays within what every target arch grants a block.
#[test]
fn stage_bytes_match_the_kernels() {
    let mut seen = 0;
    for spec in crate::kernels::KERNELS {
        if !matches!(spec.key.op, Op::MoeGateUp | Op::MoeDown) {
            continue;
        }
        if param(spec, "direct", 0) == 1 {
            // the register-direct form stages nothing (launched with no dynamic smem)
            assert!(
                !spec.source.contains("md_check_smem(WARPS"),
                "{}: a direct instance must not check staged smem",
                spec.name
            );
            seen += 1;
            continue;
        }
        let line = spec
            .source
            .lines()
            .find_map(|l| l.strip_prefix("#define MD_SBYTES "))
            .unwrap_or_else(|| panic!("{}: no MD_SBYTES", spec.name));
        let n: usize = line.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(stage_bytes(spec.key.quant), Some(n), "{}", spec.name);
        let (w, st) = (
            spec.param_u32("warps").unwrap() as usize,
            buffers(spec, 0) as usize,
        );
        assert!(st > 0, "{}", spec.name);
        // sm_120 / sm_121: 99 KiB per block
        assert!(w * st * n <= 99 * 1024, "{}", spec.name);
        seen += 1;
    }
    assert!(seen >= 10, "{seen} fused instances");
}

fn gate_up() -> MoeGateUpArgs {
    let (e, ff, k, pairs) = (128usize, 768usize, 2048usize, 8usize);
    let bank = e * ff * (k / 256) * 144;
    MoeGateUpArgs {
        gate: p(0x1000_0000, bank),
        up: p(0x2000_0000, bank),
        n_experts: e,
        ids: p(0x100, pairs),
        pairs,
        x_div: 8,
        xq: p(0x1000, k),
        xds: p(0x2000, k / 16),
        k,
        ff,
        act: Activation::Silu,
        h: DevPtr::null(),
        hq: p(0x10000, pairs * ff),
        hds: p(0x20000, pairs * ff / 16),
    }
}

#[test]
fn gate_up_validation() {
    let ok = gate_up();
    assert_eq!(check_gate_up(Quant::Q4K, &ok).unwrap(), 768 * 8 * 144);
    assert!(check_gate_up(
        Quant::Q4K,
        &MoeGateUpArgs {
            h: p(0x30000, 8 * 768),
            ..ok
        }
    )
    .is_ok());
    assert!(check_gate_up(Quant::F16, &ok).is_err());
    for bad in [
        MoeGateUpArgs {
            up: p(0x2000_0001, ok.up.len()),
            ..ok
        },
        MoeGateUpArgs {
            gate: p(0x1000_0000, ok.gate.len() - 1),
            ..ok
        },
        MoeGateUpArgs { ff: 784, ..ok },
        MoeGateUpArgs { pairs: 0, ..ok },
        MoeGateUpArgs { x_div: 0, ..ok },
        // two tokens' pairs need two side-car rows
        MoeGateUpArgs { pairs: 9, ..ok },
        MoeGateUpArgs {
            hq: p(0x10000, 8 * 768 - 1),
            ..ok
        },
        MoeGateUpArgs {
            h: p(0x30000, 8 * 768 - 1),
            ..ok
        },
        MoeGateUpArgs {
            ids: p(0x100, 7),
            ..ok
        },
    ] {
        assert!(check_gate_up(Quant::Q4K, &bad).is_err(), "{bad:?}");
    }
}

fn down() -> MoeDownArgs {
    let (e, ff, out, n, top_k) = (128usize, 768usize, 2048usize, 1usize, 8usize);
    MoeDownArgs {
        down: p(0x1000_0000, e * out * 3 * 210),
        n_experts: e,
        ids: p(0x100, n * top_k),
        wts: p(0x200, n * top_k),
        n,
        top_k,
        hq: p(0x1000, n * top_k * ff),
        hds: p(0x8000, n * top_k * ff / 16),
        ff,
        out,
        y: p(0x10000, n * out),
        ids_early: true,
    }
}

#[test]
fn down_validation() {
    let ok = down();
    assert_eq!(check_down(Quant::Q6K, 16, &ok).unwrap(), 2048 * 3 * 210);
    assert!(check_down(Quant::Bf16, 16, &ok).is_err());
    // top_k past the instance's slots
    assert!(check_down(Quant::Q6K, 4, &ok).is_err());
    for bad in [
        MoeDownArgs {
            down: p(0x1000_0008, ok.down.len()),
            ..ok
        },
        MoeDownArgs {
            y: p(0x10000, 2047),
            ..ok
        },
        MoeDownArgs {
            hq: p(0x1000, 8 * 768 - 1),
            ..ok
        },
        MoeDownArgs {
            wts: p(0x200, 7),
            ..ok
        },
        MoeDownArgs { n: 2, ..ok },
        MoeDownArgs { ff: 700, ..ok },
        MoeDownArgs { top_k: 0, ..ok },
    ] {
        assert!(check_down(Quant::Q6K, 16, &bad).is_err(), "{bad:?}");
    }
}
