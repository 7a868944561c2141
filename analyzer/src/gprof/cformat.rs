//! Number formatting identical to C's `printf` for the conversions gprof uses (`%g`, and the
//! fixed-point ones, which Rust's `{:.N}` already rounds the same way: exact value, ties to even).

/// C's `%g` with the default precision of 6.
pub fn g(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let precision = 6i32;
    // Exponent after rounding to `precision` significant digits.
    let e_form = format!("{:.*e}", (precision - 1) as usize, value);
    let (mantissa, exp) = e_form.split_once('e').unwrap_or((&e_form, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if exp < -4 || exp >= precision {
        let m = strip_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (precision - 1 - exp).max(0) as usize;
        strip_zeros(&format!("{value:.decimals$}"))
    }
}

fn strip_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::g;

    #[test]
    fn matches_c_percent_g() {
        assert_eq!(g(0.01), "0.01");
        assert_eq!(g(0.001), "0.001");
        assert_eq!(g(1.0 / 997.0), "0.00100301");
        assert_eq!(g(0.00001), "1e-05");
        assert_eq!(g(1.0), "1");
        assert_eq!(g(1234567.0), "1.23457e+06");
    }
}

/// A float printed the way C's `%W.Pf` prints it, including `nan`/`-nan` and `inf`/`-inf` (which
/// appear when a profile has arcs but no histogram, so gprof divides by a zero rate).
#[derive(Clone, Copy, Debug)]
pub struct CFloat(pub f64);

impl std::fmt::Display for CFloat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        if v.is_finite() {
            return std::fmt::Display::fmt(&v, f);
        }
        let text = match (v.is_nan(), v.is_sign_negative()) {
            (true, true) => "-nan",
            (true, false) => "nan",
            (false, true) => "-inf",
            (false, false) => "inf",
        };
        let width = f.width().unwrap_or(0);
        if f.align() == Some(std::fmt::Alignment::Left) {
            write!(f, "{text:<width$}")
        } else {
            write!(f, "{text:>width$}")
        }
    }
}
