//! Command-line parsing: each command declares its options and positionals in a table; the
//! parser accepts them in any order, as `--name value`, `--name=value`, `-x value`, `-x=value`
//! or `-xvalue`, takes everything after `--` as positional, and refuses anything unknown,
//! missing or repeated by naming the argument.
//!
//! Arguments arrive as `OsString`s: a path (a model directory, `--file`, `--out`, ...) may be
//! any bytes the OS allows, while text (a prompt, a stop string, a number) must be UTF-8 and is
//! otherwise a usage error naming the argument.

use std::ffi::{OsStr, OsString};
use std::path::Path;
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
    /// The value is a path: kept as the OS gave it (it need not be UTF-8).
    pub path: bool,
    pub help: &'static str,
}

/// A flag.
pub const fn flag(long: &'static str, help: &'static str) -> Opt {
    Opt { long, short: None, value: None, repeat: false, path: false, help }
}

/// An option with a text value.
pub const fn val(long: &'static str, value: &'static str, help: &'static str) -> Opt {
    Opt { long, short: None, value: Some(value), repeat: false, path: false, help }
}

/// An option whose value is a path.
pub const fn path(long: &'static str, value: &'static str, help: &'static str) -> Opt {
    Opt { long, short: None, value: Some(value), repeat: false, path: true, help }
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
    /// Option name and value; non-path values are checked UTF-8 when parsed.
    values: Vec<(&'static str, Option<OsString>)>,
    positionals: Vec<OsString>,
}

/// How the help text ends: the argument forms every command accepts.
const FORMS: &str = "\nOptions take a value as `--name VALUE` or `--name=VALUE` (one letter: `-n VALUE`, `-n=VALUE`, \
`-nVALUE`), in any order among the positionals. Everything after `--` is positional, so a prompt \
that starts with `-` goes after it: `waste run MODEL -n 8 -- \"-hello\"`.\n";

impl Command {
    fn all_opts(&self) -> impl Iterator<Item = &'static Opt> {
        self.opts.iter().flat_map(|g| g.iter())
    }

    fn find_long(&self, name: &str) -> Option<&'static Opt> {
        self.all_opts().find(|o| o.long == name)
    }

    fn find_short(&self, c: char) -> Option<&'static Opt> {
        self.all_opts().find(|o| o.short == Some(c))
    }

    /// Parses `args` (everything after the command name).
    pub fn parse(&self, args: &[OsString]) -> Result<Args, Usage> {
        let mut out = Args { values: Vec::new(), positionals: Vec::new() };
        let mut i = 0;
        let mut only_positionals = false;
        while i < args.len() {
            let a = &args[i];
            i += 1;
            let bytes = a.as_encoded_bytes();
            if only_positionals || bytes == b"-" || !bytes.starts_with(b"-") || looks_numeric(bytes) {
                out.positionals.push(a.clone());
                continue;
            }
            if bytes == b"--" {
                only_positionals = true;
                continue;
            }
            let (opt, inline) = self.option_of(a)?;
            let value = match (opt.value, inline) {
                (None, None) => None,
                (None, Some(_)) => return Err(Usage(format!("{}: option `--{}` takes no value", self.name, opt.long))),
                (Some(_), Some(v)) => Some(v),
                (Some(meta), None) => {
                    let v = args.get(i).filter(|v| !looks_like_option(v.as_encoded_bytes())).ok_or_else(|| {
                        Usage(format!("{}: option `--{}` needs a value ({meta})", self.name, opt.long))
                    })?;
                    i += 1;
                    Some(v.clone())
                }
            };
            if let Some(v) = &value {
                if !opt.path && v.to_str().is_none() {
                    return Err(Usage(format!("{}: option `--{}`: the value `{}` is not valid UTF-8",
                        self.name, opt.long, v.to_string_lossy())));
                }
            }
            if !opt.repeat && out.values.iter().any(|(n, _)| *n == opt.long) {
                return Err(Usage(format!("{}: option `--{}` given twice", self.name, opt.long)));
            }
            out.values.push((opt.long, value));
        }
        let rest = self.positionals.last().is_some_and(|p| p.ends_with("..."));
        if !rest && out.positionals.len() > self.positionals.len() {
            let extra = out.positionals[self.positionals.len()].to_string_lossy();
            return Err(Usage(format!("{}: unexpected argument `{extra}` (usage: waste {})", self.name, self.usage)));
        }
        Ok(out)
    }

    /// The option an argument starting with `-` names, and the value written into it
    /// (`--name=value`, `-x=value`, `-xvalue`).
    fn option_of(&self, a: &OsStr) -> Result<(&'static Opt, Option<OsString>), Usage> {
        let bytes = a.as_encoded_bytes();
        let shown = a.to_string_lossy();
        let hint = "an argument that starts with `-` goes after `--`";
        if let Some(long) = bytes.strip_prefix(b"--") {
            let eq = long.iter().position(|&b| b == b'=');
            let name = std::str::from_utf8(&long[..eq.unwrap_or(long.len())]).ok();
            let opt = name.and_then(|n| self.find_long(n))
                .ok_or_else(|| Usage(format!("{}: unknown option `{}` ({hint})", self.name, shown.split('=').next().unwrap_or(""))))?;
            return Ok((opt, eq.map(|e| tail(a, 2 + e + 1))));
        }
        // One letter: `-x`, then an optional `=` and the value, or the value itself.
        let c = shown[1..].chars().next().unwrap_or('-');
        let opt = self.find_short(c).ok_or_else(|| Usage(format!("{}: unknown option `{shown}` ({hint})", self.name)))?;
        let after = 1 + c.len_utf8();
        let inline = match bytes.get(after) {
            None => None,
            Some(b'=') => Some(tail(a, after + 1)),
            Some(_) => Some(tail(a, after)),
        };
        if opt.value.is_none() && inline.is_some() {
            return Err(Usage(format!("{}: unknown option `{shown}` (`-{c}` is `--{}`, which takes no value; {hint})",
                self.name, opt.long)));
        }
        Ok((opt, inline))
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
        s.push_str(FORMS);
        s
    }
}

/// `a` from byte `n` on, where the first `n` bytes are ASCII (an option's name and `=`), so
/// the split falls on a character boundary whatever the rest holds.
fn tail(a: &OsStr, n: usize) -> OsString {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        OsStr::from_bytes(&a.as_bytes()[n..]).to_os_string()
    }
    #[cfg(not(unix))]
    {
        let s = a.to_string_lossy();
        OsString::from(s.get(n..).unwrap_or(""))
    }
}

fn looks_numeric(a: &[u8]) -> bool {
    a.len() > 1 && a[0] == b'-' && (a[1].is_ascii_digit() || a[1] == b'.')
}

/// A value that is really the next option (`--temp --seed 1`) is a missing value.
fn looks_like_option(v: &[u8]) -> bool {
    v.len() > 1 && v[0] == b'-' && !looks_numeric(v)
}

impl Args {
    /// True when the flag was given.
    pub fn flag(&self, name: &str) -> bool {
        self.values.iter().any(|(n, _)| *n == name)
    }

    fn raw(&self, name: &str) -> Option<&OsStr> {
        self.values.iter().rev().find(|(n, _)| *n == name).and_then(|(_, v)| v.as_deref())
    }

    /// The value of a single-valued text option (checked UTF-8 when parsed).
    pub fn value(&self, name: &str) -> Option<&str> {
        self.raw(name).and_then(OsStr::to_str)
    }

    /// The value of a path option, as the OS gave it.
    pub fn path(&self, name: &str) -> Option<&Path> {
        self.raw(name).map(Path::new)
    }

    /// Every value of a repeatable text option, in order.
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.values.iter().filter(|(n, _)| *n == name).filter_map(|(_, v)| v.as_deref().and_then(OsStr::to_str)).collect()
    }

    /// How many positionals were given.
    pub fn positional_count(&self) -> usize {
        self.positionals.len()
    }

    /// Positional `i` as a path.
    pub fn positional_path(&self, i: usize) -> Option<&Path> {
        self.positionals.get(i).map(Path::new)
    }

    /// Positional `i` as text; not UTF-8 is a usage error naming it as `what`.
    pub fn positional_text(&self, i: usize, what: &str) -> Result<Option<&str>, Usage> {
        match self.positionals.get(i) {
            None => Ok(None),
            Some(p) => p.to_str().map(Some).ok_or_else(|| {
                Usage(format!("argument {what} `{}` is not valid UTF-8", p.to_string_lossy()))
            }),
        }
    }

    /// Positionals `from..` as text (for `IDS...`).
    pub fn positional_texts(&self, from: usize, what: &str) -> Result<Vec<&str>, Usage> {
        (from..self.positionals.len()).map(|i| self.positional_text(i, what).map(|t| t.unwrap_or(""))).collect()
    }

    /// Parses a numeric option and checks it lies in `lo..=hi`.
    pub fn num<T>(&self, name: &str, lo: T, hi: T) -> Result<Option<T>, Usage>
    where
        T: FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        self.num_where(name, |n| n >= lo && n <= hi, &format!("is out of range {lo}..={hi}"))
    }

    /// Parses a numeric option and checks `ok`; `rule` says what a value must be
    /// ("must be > 0 and <= 1"), for the message.
    pub fn num_where<T>(&self, name: &str, ok: impl Fn(T) -> bool, rule: &str) -> Result<Option<T>, Usage>
    where
        T: FromStr + Copy,
    {
        let Some(v) = self.value(name) else { return Ok(None) };
        let n: T = v.parse().map_err(|_| Usage(format!("option `--{name}`: `{v}` is not a valid number")))?;
        if !ok(n) || v.eq_ignore_ascii_case("nan") {
            return Err(Usage(format!("option `--{name}`: {v} {rule}")));
        }
        Ok(Some(n))
    }

    /// A size option ([`parse_size`]) of at least `min` bytes; every size option reports a bad
    /// value in the same words.
    pub fn size(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, Usage> {
        let Some(v) = self.value(name) else { return Ok(None) };
        let n = parse_size(v).ok_or_else(|| Usage(format!(
            "option `--{name}`: `{v}` is not a size (bytes, or a number with K, M, G or T, optionally followed by i and B: \
             binary units, 1K = 1KiB = 1KB = 1024 bytes)")))?;
        if n < min || n > max {
            return Err(Usage(format!("option `--{name}`: {v} is out of range {}..={}", show_size(min), show_size(max))));
        }
        Ok(Some(n))
    }
}

/// `bytes` as the largest exact binary unit ("4K", "1T", "4096").
fn show_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses a size: a non-negative number (a fraction allowed) of bytes, optionally followed by
/// a unit K, M, G or T (any case), then optionally `i`, then optionally `B`; `4G`, `4Gi`,
/// `4GiB` and `4GB` all mean 4 × 2^30 (binary units throughout). `B` alone means bytes; `i`
/// needs a unit before it (`4iB` is refused). `None` for anything else or an overflow.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.strip_suffix(['B', 'b']).unwrap_or(unit);
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" => 0,
        "K" | "KI" => 10,
        "M" | "MI" => 20,
        "G" | "GI" => 30,
        "T" | "TI" => 40,
        _ => return None,
    };
    if num.is_empty() || !num.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mult = 1u64 << shift;
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * mult as f64;
    (f.is_finite() && v < u64::MAX as f64).then_some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CMD: Command = Command {
        name: "run",
        usage: "run MODEL [PROMPT]",
        about: "",
        opts: &[&[val("temp", "F", ""), Opt { long: "n", short: Some('n'), value: Some("N"), repeat: false, path: false, help: "" },
            Opt { long: "stop", short: None, value: Some("S"), repeat: true, path: false, help: "" }, flag("json", ""),
            Opt { long: "help", short: Some('h'), value: None, repeat: false, path: false, help: "" }, path("file", "F", "")]],
        positionals: &["MODEL", "PROMPT"],
    };

    fn os(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    fn parse(a: &[&str]) -> Result<Args, Usage> {
        CMD.parse(&os(a))
    }

    fn texts(a: &Args) -> Vec<&str> {
        a.positional_texts(0, "X").unwrap()
    }

    #[test]
    fn options_and_positionals_in_any_order() {
        let a = parse(&["--temp", "0", "m", "-n", "3", "hi", "--stop", "x", "--stop=y"]).unwrap();
        assert_eq!(texts(&a), ["m", "hi"]);
        assert_eq!(a.value("temp"), Some("0"));
        assert_eq!(a.num::<usize>("n", 0, 10).unwrap(), Some(3));
        assert_eq!(a.values("stop"), ["x", "y"]);
    }

    #[test]
    fn values_written_into_the_option() {
        for form in [&["m", "-n=3"][..], &["m", "-n3"], &["m", "--n=3"], &["m", "-n", "3"]] {
            assert_eq!(parse(form).unwrap().num::<usize>("n", 0, 10).unwrap(), Some(3), "{form:?}");
        }
        assert_eq!(parse(&["m", "--stop=a=b"]).unwrap().values("stop"), ["a=b"]);
        assert_eq!(parse(&["m", "--stop="]).unwrap().values("stop"), [""]);
    }

    #[test]
    fn a_double_dash_ends_the_options() {
        let a = parse(&["m", "-n", "2", "--", "-hello"]).unwrap();
        assert_eq!(texts(&a), ["m", "-hello"]);
        assert_eq!(a.value("n"), Some("2"));
        let a = parse(&["--", "--json", "--"]).unwrap();
        assert_eq!(texts(&a), ["--json", "--"]);
        assert!(!a.flag("json"));
        // Without `--`, `-hello` is `-h` with a value it cannot take: the message says how.
        let e = parse(&["m", "-hello"]).unwrap_err().0;
        assert!(e.contains("`-hello`") && e.contains("after `--`"), "{e}");
        let e = parse(&["m", "-x"]).unwrap_err().0;
        assert!(e.contains("`-x`") && e.contains("after `--`"), "{e}");
        // Negative numbers are values and positionals, not options.
        assert_eq!(texts(&parse(&["m", "-1.5"]).unwrap()), ["m", "-1.5"]);
    }

    #[test]
    fn errors_name_the_argument() {
        assert!(parse(&["m", "--bogus"]).unwrap_err().0.contains("--bogus"));
        assert!(parse(&["m", "--bogus=1"]).unwrap_err().0.contains("`--bogus`"));
        assert!(parse(&["m", "--temp"]).unwrap_err().0.contains("--temp"));
        assert!(parse(&["m", "--temp", "--json"]).unwrap_err().0.contains("--temp"));
        assert!(parse(&["m", "a", "b"]).unwrap_err().0.contains("`b`"));
        assert!(parse(&["m", "--json=1"]).unwrap_err().0.contains("--json"));
        assert!(parse(&["m", "--temp", "1", "--temp", "2"]).unwrap_err().0.contains("twice"));
        let a = parse(&["m", "--temp", "-1"]).unwrap();
        assert!(a.num::<f32>("temp", 0.0, 10.0).unwrap_err().0.contains("out of range"));
        assert!(a.num::<usize>("n", 0, 1).unwrap().is_none());
        let e = a.num_where::<f32>("temp", |v| v > 0.0 && v <= 1.0, "must be > 0 and <= 1").unwrap_err().0;
        assert_eq!(e, "option `--temp`: -1 must be > 0 and <= 1");
    }

    #[cfg(unix)]
    #[test]
    fn paths_may_be_any_bytes_and_text_must_be_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let bad = || OsString::from_vec(b"Once\xff".to_vec());
        let a = CMD.parse(&[OsString::from_vec(b"/tmp/m\xfe".to_vec()), bad()]).unwrap();
        assert_eq!(a.positional_path(0).unwrap().as_os_str().as_encoded_bytes(), b"/tmp/m\xfe");
        let e = a.positional_text(1, "PROMPT").unwrap_err().0;
        assert!(e.contains("PROMPT") && e.contains("UTF-8"), "{e}");
        let mut file = b"--file=/x/\xff".to_vec();
        let a = CMD.parse(&[OsString::from("m"), OsString::from_vec(file.clone())]).unwrap();
        assert_eq!(a.path("file").unwrap().as_os_str().as_encoded_bytes(), b"/x/\xff");
        file.splice(2..6, b"stop".iter().copied());
        let e = CMD.parse(&[OsString::from("m"), OsString::from_vec(file)]).unwrap_err().0;
        assert!(e.contains("--stop") && e.contains("UTF-8"), "{e}");
        let e = CMD.parse(&[OsString::from("m"), OsString::from("--stop"), bad()]).unwrap_err().0;
        assert!(e.contains("--stop") && e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn sizes() {
        for (text, want) in [("4G", 4u64 << 30), ("4GiB", 4 << 30), ("4Gi", 4 << 30), ("4GB", 4 << 30), ("4gib", 4 << 30),
            ("512M", 512 << 20), ("1.5K", 1536), ("123", 123), ("123B", 123), ("2T", 2 << 40), (" 8k ", 8192), ("0", 0)] {
            assert_eq!(parse_size(text), Some(want), "{text}");
        }
        for text in ["4iB", "4i", "iB", "B", "", "x", "-1G", "G", "4GiBB", "4 G", "4X", "1.2.3K", "+4G", ".5K", "99999999999T", "1e3"] {
            assert_eq!(parse_size(text), None, "{text}");
        }
        assert_eq!(parse_size("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_size("18446744073709551616"), None);
    }

    #[test]
    fn size_options_share_one_message() {
        const SIZES: Command = Command { name: "x", usage: "", about: "", opts: &[&[val("budget", "SIZE", ""), val("cache", "SIZE", "")]], positionals: &[] };
        let cmd = &SIZES;
        let a = cmd.parse(&os(&["--budget", "4iB", "--cache", "0"])).unwrap();
        let e = a.size("budget", 1, u64::MAX).unwrap_err().0;
        assert!(e.starts_with("option `--budget`: `4iB` is not a size"), "{e}");
        assert!(a.size("cache", 1, u64::MAX).unwrap_err().0.contains("out of range 1..="));
        let a = cmd.parse(&os(&["--budget=4GiB"])).unwrap();
        assert_eq!(a.size("budget", 1, u64::MAX).unwrap(), Some(4 << 30));
        assert_eq!(a.size("cache", 1, u64::MAX).unwrap(), None);
    }
}
