//! The clock of `strftime_now`: a calendar date-time and Python's `datetime.strftime` with the
//! C locale's directives (as glibc formats them), including glibc's `-`, `_`, `0` and `^` flags.
//! There is no time-zone database: "now" is UTC, and `%z`/`%Z` print nothing, as for Python's
//! naive datetimes.

use crate::error::{Error, Result};

/// A calendar date and time (proleptic Gregorian, no time zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December"];

fn leap(y: i32) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn month_days(y: i32, m: u32) -> u32 {
    match m {
        2 if leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y as i64 - 1 } else { y as i64 };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y as i32, m, d)
}

impl DateTime {
    /// A checked date-time (year 1..=9999, as Python's `datetime`).
    pub fn new(year: i32, month: u32, day: u32, hour: u32, minute: u32, second: u32) -> Result<DateTime> {
        if !(1..=9999).contains(&year) || !(1..=12).contains(&month) || day == 0 || day > month_days(year, month)
            || hour > 23 || minute > 59 || second > 59 {
            return Err(Error::arg(format!(
                "date-time {year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} is not a valid date and time")));
        }
        Ok(DateTime { year, month, day, hour, minute, second })
    }

    /// `YYYY-MM-DD`, optionally followed by `T` or a space and `HH:MM` or `HH:MM:SS`.
    pub fn parse(text: &str) -> Result<DateTime> {
        let bad = || Error::arg(format!("`{text}` is not a date (YYYY-MM-DD, optionally with THH:MM[:SS])"));
        let (date, time) = match text.split_once(['T', ' ']) {
            Some((d, t)) => (d, Some(t)),
            None => (text, None),
        };
        let num = |s: &str, len: usize| -> Result<u32> {
            if s.len() != len || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        let d: Vec<&str> = date.split('-').collect();
        let [y, m, day] = d[..] else { return Err(bad()) };
        let (mut hh, mut mm, mut ss) = (0, 0, 0);
        if let Some(t) = time {
            let parts: Vec<&str> = t.split(':').collect();
            match parts[..] {
                [h, mi] => (hh, mm) = (num(h, 2)?, num(mi, 2)?),
                [h, mi, s] => (hh, mm, ss) = (num(h, 2)?, num(mi, 2)?, num(s, 2)?),
                _ => return Err(bad()),
            }
        }
        DateTime::new(num(y, 4)? as i32, num(m, 2)?, num(day, 2)?, hh, mm, ss)
    }

    /// The UTC date-time of a Unix time in seconds.
    pub fn from_unix(secs: i64) -> DateTime {
        let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
        let (year, month, day) = civil_from_days(days);
        DateTime { year, month, day, hour: (rem / 3600) as u32, minute: (rem % 3600 / 60) as u32, second: (rem % 60) as u32 }
    }

    /// The current time in UTC (the system clock; no time-zone database is read).
    pub fn now_utc() -> DateTime {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        DateTime::from_unix(secs)
    }

    fn days(&self) -> i64 {
        days_from_civil(self.year, self.month, self.day)
    }

    /// Monday = 0.
    fn weekday(&self) -> usize {
        (self.days() + 3).rem_euclid(7) as usize
    }

    /// Day of the year, 1-based.
    fn yday(&self) -> i64 {
        self.days() - days_from_civil(self.year, 1, 1) + 1
    }

    /// ISO 8601 year and week.
    fn iso_week(&self) -> (i32, i64) {
        let wd = self.weekday() as i64; // Monday = 0
        let thursday = self.days() - wd + 3;
        let (y, _, _) = civil_from_days(thursday);
        let week = (thursday - days_from_civil(y, 1, 1)) / 7 + 1;
        (y, week)
    }
}

/// Python's `dt.strftime(fmt)` on Linux.
pub fn strftime(dt: &DateTime, fmt: &str) -> String {
    let mut out = String::new();
    let mut it = fmt.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut flag = None;
        if let Some(&f @ ('-' | '_' | '0' | '^' | '#')) = it.peek() {
            flag = Some(f);
            it.next();
        }
        let Some(d) = it.next() else {
            out.push('%');
            if let Some(f) = flag {
                out.push(f);
            }
            break;
        };
        match directive(dt, d) {
            Some(Field::Num(v, width, pad)) => {
                let pad = match flag {
                    Some('-') => None,
                    Some('_') => Some(' '),
                    Some('0') => Some('0'),
                    _ => pad,
                };
                let s = v.to_string();
                if let Some(p) = pad {
                    out.extend(std::iter::repeat_n(p, width.saturating_sub(s.len())));
                }
                out.push_str(&s);
            }
            Some(Field::Text(t)) => out.push_str(&if flag == Some('^') { t.to_uppercase() } else { t }),
            None => {
                out.push('%');
                if let Some(f) = flag {
                    out.push(f);
                }
                out.push(d);
            }
        }
    }
    out
}

enum Field {
    /// A number, its width and default padding.
    Num(i64, usize, Option<char>),
    Text(String),
}

fn directive(dt: &DateTime, d: char) -> Option<Field> {
    let num = |v: i64, w: usize| Some(Field::Num(v, w, Some('0')));
    let text = |s: String| Some(Field::Text(s));
    let hour12 = if dt.hour % 12 == 0 { 12 } else { dt.hour % 12 } as i64;
    let wd = dt.weekday();
    let sunday0 = (wd + 1) % 7;
    match d {
        'a' => text(DAYS[wd][..3].to_string()),
        'A' => text(DAYS[wd].to_string()),
        'b' | 'h' => text(MONTHS[dt.month as usize - 1][..3].to_string()),
        'B' => text(MONTHS[dt.month as usize - 1].to_string()),
        'c' => text(strftime(dt, "%a %b %e %H:%M:%S %Y")),
        'C' => num(dt.year as i64 / 100, 2),
        'd' => num(dt.day as i64, 2),
        'D' | 'x' => text(strftime(dt, "%m/%d/%y")),
        'e' => Some(Field::Num(dt.day as i64, 2, Some(' '))),
        'f' => num(0, 6),
        'F' => text(strftime(dt, "%Y-%m-%d")),
        'G' => Some(Field::Num(dt.iso_week().0 as i64, 1, None)),
        'g' => num(dt.iso_week().0 as i64 % 100, 2),
        'H' => num(dt.hour as i64, 2),
        'I' => num(hour12, 2),
        'j' => num(dt.yday(), 3),
        'k' => Some(Field::Num(dt.hour as i64, 2, Some(' '))),
        'l' => Some(Field::Num(hour12, 2, Some(' '))),
        'm' => num(dt.month as i64, 2),
        'M' => num(dt.minute as i64, 2),
        'n' => text("\n".into()),
        'p' => text(if dt.hour < 12 { "AM" } else { "PM" }.into()),
        'P' => text(if dt.hour < 12 { "am" } else { "pm" }.into()),
        'r' => text(strftime(dt, "%I:%M:%S %p")),
        'R' => text(strftime(dt, "%H:%M")),
        's' => Some(Field::Num(dt.days() * 86400 + (dt.hour * 3600 + dt.minute * 60 + dt.second) as i64, 1, None)),
        'S' => num(dt.second as i64, 2),
        't' => text("\t".into()),
        'T' | 'X' => text(strftime(dt, "%H:%M:%S")),
        'u' => Some(Field::Num(wd as i64 + 1, 1, None)),
        'U' => num((dt.yday() - 1 + 7 - sunday0 as i64) / 7, 2),
        'V' => num(dt.iso_week().1, 2),
        'w' => Some(Field::Num(sunday0 as i64, 1, None)),
        'W' => num((dt.yday() - 1 + 7 - wd as i64) / 7, 2),
        'y' => num(dt.year as i64 % 100, 2),
        'Y' => Some(Field::Num(dt.year as i64, 1, None)),
        'z' | 'Z' => text(String::new()),
        '%' => text("%".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    #[test]
    fn formats_like_python() {
        let dt = DateTime::new(2024, 7, 26, 12, 0, 0).must();
        assert_eq!(strftime(&dt, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(strftime(&dt, "%Y-%m-%d"), "2024-07-26");
        assert_eq!(strftime(&dt, "%A %B %-d %j %U %W %V %u %w %I%p %c"), "Friday July 26 208 29 30 30 5 5 12PM Fri Jul 26 12:00:00 2024");
        assert_eq!(strftime(&dt, "%e|%_m|%^a|%q|%"), "26| 7|FRI|%q|%");
        let jan1 = DateTime::new(2021, 1, 1, 0, 5, 9).must();
        assert_eq!(strftime(&jan1, "%G-W%V %U %W %H:%M:%S %I %p"), "2020-W53 00 00 00:05:09 12 AM");
    }

    #[test]
    fn unix_times_and_parsing() {
        assert_eq!(DateTime::from_unix(0), DateTime::new(1970, 1, 1, 0, 0, 0).must());
        assert_eq!(DateTime::from_unix(1721995200), DateTime::new(2024, 7, 26, 12, 0, 0).must());
        assert_eq!(DateTime::parse("2024-07-26").must(), DateTime::new(2024, 7, 26, 0, 0, 0).must());
        assert_eq!(DateTime::parse("2024-02-29T23:59:58").must(), DateTime::new(2024, 2, 29, 23, 59, 58).must());
        for bad in ["2023-02-29", "2024-7-26", "24-07-26", "2024-07-26T25:00", "x"] {
            assert!(DateTime::parse(bad).is_err(), "{bad}");
        }
    }
}
