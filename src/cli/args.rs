//! Command-line parsing: each command declares its options and positionals in a table; the
//! parser accepts them in any order, `--name value`, `--name=value` and `-x value`, and
//! refuses anything unknown, missing or repeated by naming the argument.

use std::str::FromStr;

/// One option of a command.
pub struct Opt {
    /// Long name without dashes.
    pub long: &'static str,
    /// Optional one-letter alias.
    pub short: Option<char>,
    /// Name of the value in help (`None` for a flag).
    pub value: Option<&'static str>,
    /// May be given more than once.
    pub repeat: bool,
    pub help: &'static str,
}

/// A flag.
pub const fn flag(long: &'static str, help: &'static str) -> Opt {
    Opt { long, short: None, value: None, repeat: false, help }
}

/// An option with a value.
pub const fn val(long: &'static str, value: &'static str, help: &'static str) -> Opt {
    Opt { long, short: None, value: Some(value), repeat: false, help }
}

/// A command's declaration.
pub struct Command {
    pub name: &'static str,
    pub usage: &'static str,
    pub about: &'static str,
    pub opts: &'static [&'static [Opt]],
    /// Names of the positionals, in order; a trailing `...` name takes the rest.
    pub positionals: &'static [&'static str],
}

/// A usage error (exit status 2).
#[derive(Debug)]
pub struct Usage(pub String);

/// Parsed arguments.
#[derive(Debug)]
pub struct Args {
    values: Vec<(&'static str, Option<String>)>,
    pub positionals: Vec<String>,
}

impl Command {
    fn find_long(&self, name: &str) -> Option<&'static Opt> {
        self.opts.iter().flat_map(|g| g.iter()).find(|o| o.long == name)
    }

    fn find_short(&self, c: char) -> Option<&'static Opt> {
        self.opts.iter().flat_map(|g| g.iter()).find(|o| o.short == Some(c))
    }

    /// Parses `args` (everything after the command name).
    pub fn parse(&self, args: &[String]) -> Result<Args, Usage> {
        let mut out = Args { values: Vec::new(), positionals: Vec::new() };
        let mut i = 0;
        let mut only_positionals = false;
        while i < args.len() {
            let a = &args[i];
            i += 1;
            if only_positionals || a == "-" || !a.starts_with('-') || looks_numeric(a) {
                out.positionals.push(a.clone());
                continue;
            }
            if a == "--" {
                only_positionals = true;
                continue;
            }
            let (opt, inline) = if let Some(long) = a.strip_prefix("--") {
                let (name, inline) = match long.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (long, None),
                };
                let opt = self.find_long(name).ok_or_else(|| Usage(format!("{}: unknown option `--{name}`", self.name)))?;
                (opt, inline)
            } else {
                let mut chars = a[1..].chars();
                let c = chars.next().unwrap_or('-');
                let rest: String = chars.collect();
                let opt = self.find_short(c).ok_or_else(|| Usage(format!("{}: unknown option `-{c}`", self.name)))?;
                (opt, if rest.is_empty() { None } else { Some(rest) })
            };
            let value = match (opt.value, inline) {
                (None, None) => None,
                (None, Some(_)) => return Err(Usage(format!("{}: option `--{}` takes no value", self.name, opt.long))),
                (Some(_), Some(v)) => Some(v),
                (Some(meta), None) => {
                    let v = args.get(i).filter(|v| !looks_like_option(v)).ok_or_else(|| {
                        Usage(format!("{}: option `--{}` needs a value ({meta})", self.name, opt.long))
                    })?;
                    i += 1;
                    Some(v.clone())
                }
            };
            if !opt.repeat && out.values.iter().any(|(n, _)| *n == opt.long) {
                return Err(Usage(format!("{}: option `--{}` given twice", self.name, opt.long)));
            }
            out.values.push((opt.long, value));
        }
        let rest = self.positionals.last().is_some_and(|p| p.ends_with("..."));
        if !rest && out.positionals.len() > self.positionals.len() {
            let extra = &out.positionals[self.positionals.len()];
            return Err(Usage(format!("{}: unexpected argument `{extra}` (usage: waste {})", self.name, self.usage)));
        }
        Ok(out)
    }

    /// The help text.
    pub fn help(&self) -> String {
        let mut s = format!("{}\n\nUsage: waste {}\n", self.about, self.usage);
        for group in self.opts {
            if group.is_empty() {
                continue;
            }
            s.push('\n');
            for o in group.iter() {
                let short = o.short.map(|c| format!("-{c}, ")).unwrap_or_default();
                let left = match o.value {
                    Some(v) => format!("{short}--{} {v}", o.long),
                    None => format!("{short}--{}", o.long),
                };
                s.push_str(&format!("  {left:<28} {}\n", o.help));
            }
        }
        s
    }
}

fn looks_numeric(a: &str) -> bool {
    a.len() > 1 && a.starts_with('-') && a[1..].starts_with(|c: char| c.is_ascii_digit() || c == '.')
}

/// A value that is really the next option (`--temp --seed 1`) is a missing value.
fn looks_like_option(v: &str) -> bool {
    v.len() > 1 && v.starts_with('-') && !looks_numeric(v)
}

impl Args {
    /// True when the flag was given.
    pub fn flag(&self, name: &str) -> bool {
        self.values.iter().any(|(n, _)| *n == name)
    }

    /// The value of a single-valued option.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.values.iter().rev().find(|(n, _)| *n == name).and_then(|(_, v)| v.as_deref())
    }

    /// Every value of a repeatable option, in order.
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.values.iter().filter(|(n, _)| *n == name).filter_map(|(_, v)| v.as_deref()).collect()
    }

    /// Parses a numeric option and checks it lies in `lo..=hi`.
    pub fn num<T>(&self, name: &str, lo: T, hi: T) -> Result<Option<T>, Usage>
    where
        T: FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        let Some(v) = self.value(name) else { return Ok(None) };
        let n: T = v.parse().map_err(|_| Usage(format!("option `--{name}`: `{v}` is not a valid number")))?;
        if n < lo || n > hi || v.eq_ignore_ascii_case("nan") {
            return Err(Usage(format!("option `--{name}`: {v} is out of range {lo}..={hi}")));
        }
        Ok(Some(n))
    }
}

/// Parses a size: bytes, or a number with a K/M/G/T suffix in binary units (K = 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return None,
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let num = num.strip_suffix(['i', 'I']).unwrap_or(num);
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    if !(f.is_finite() && f >= 0.0) {
        return None;
    }
    let v = f * mult as f64;
    (v < u64::MAX as f64).then_some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CMD: Command = Command {
        name: "run",
        usage: "run MODEL [PROMPT]",
        about: "",
        opts: &[&[val("temp", "F", ""), Opt { long: "n", short: Some('n'), value: Some("N"), repeat: false, help: "" },
            Opt { long: "stop", short: None, value: Some("S"), repeat: true, help: "" }, flag("json", "")]],
        positionals: &["MODEL", "PROMPT"],
    };

    fn parse(a: &[&str]) -> Result<Args, Usage> {
        CMD.parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options_and_positionals_in_any_order() {
        let a = parse(&["--temp", "0", "m", "-n", "3", "hi", "--stop", "x", "--stop=y"]).unwrap();
        assert_eq!(a.positionals, ["m", "hi"]);
        assert_eq!(a.value("temp"), Some("0"));
        assert_eq!(a.num::<usize>("n", 0, 10).unwrap(), Some(3));
        assert_eq!(a.values("stop"), ["x", "y"]);
    }

    #[test]
    fn errors_name_the_argument() {
        assert!(parse(&["m", "--bogus"]).unwrap_err().0.contains("--bogus"));
        assert!(parse(&["m", "--temp"]).unwrap_err().0.contains("--temp"));
        assert!(parse(&["m", "--temp", "--json"]).unwrap_err().0.contains("--temp"));
        assert!(parse(&["m", "a", "b"]).unwrap_err().0.contains("`b`"));
        assert!(parse(&["m", "--json=1"]).unwrap_err().0.contains("--json"));
        assert!(parse(&["m", "--temp", "1", "--temp", "2"]).unwrap_err().0.contains("twice"));
        let a = parse(&["m", "--temp", "-1"]).unwrap();
        assert!(a.num::<f32>("temp", 0.0, 10.0).unwrap_err().0.contains("out of range"));
        assert!(a.num::<usize>("n", 0, 1).unwrap().is_none());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("4GiB"), None);
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("-1G"), None);
    }
}
