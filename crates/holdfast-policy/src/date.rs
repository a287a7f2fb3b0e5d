//! Calendar dates (`waiver_expires`), and "today" in UTC.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// A calendar date without a time or zone, as a TOML local date
/// (`2027-03-31`) writes it. Ordered by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date {
    year: u16,
    month: u8,
    day: u8,
}

impl Date {
    /// 0000-01-01, the earliest date: no waiver has expired on it.
    pub const MIN: Date = Date { year: 0, month: 1, day: 1 };

    /// The date, if it exists in the proleptic Gregorian calendar.
    pub fn new(year: u16, month: u8, day: u8) -> Option<Date> {
        let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
        let days = match month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        (1..=days).contains(&day).then_some(Date { year, month, day })
    }

    /// The date (UTC) of a number of days since 1970-01-01 (Howard Hinnant's
    /// `civil_from_days`).
    pub fn from_unix_days(days: i64) -> Date {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Date { year: year.clamp(0, i64::from(u16::MAX)) as u16, month, day }
    }

    /// Days since 1970-01-01 (negative before it); the inverse of
    /// [`Date::from_unix_days`] (Howard Hinnant's `days_from_civil`).
    pub fn unix_days(&self) -> i64 {
        let (m, d) = (i64::from(self.month), i64::from(self.day));
        let y = i64::from(self.year) - i64::from(m <= 2);
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let mp = if m > 2 { m - 3 } else { m + 9 };
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// Days from `self` to `later` (negative if `later` is earlier).
    pub fn days_until(&self, later: Date) -> i64 {
        later.unix_days() - self.unix_days()
    }

    /// Today's date in UTC, from the system clock.
    pub fn today_utc() -> Date {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Date::from_unix_days((secs / 86_400) as i64)
    }

    pub fn year(&self) -> u16 {
        self.year
    }
    pub fn month(&self) -> u8 {
        self.month
    }
    pub fn day(&self) -> u8 {
        self.day
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

impl std::str::FromStr for Date {
    type Err = String;

    /// `YYYY-MM-DD`.
    fn from_str(s: &str) -> Result<Date, String> {
        let bad = || format!("{s:?} is not a date; write it as YYYY-MM-DD, e.g. 2027-03-31");
        let mut parts = s.split('-');
        let (Some(y), Some(m), Some(d), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        if y.len() != 4 || m.len() != 2 || d.len() != 2 {
            return Err(bad());
        }
        let (Ok(y), Ok(m), Ok(d)) = (y.parse(), m.parse(), d.parse()) else {
            return Err(bad());
        };
        Date::new(y, m, d).ok_or_else(bad)
    }
}

impl Serialize for Date {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Date {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Date, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_since_the_unix_epoch_become_dates() {
        assert_eq!(Date::from_unix_days(0).to_string(), "1970-01-01");
        assert_eq!(Date::from_unix_days(19_723).to_string(), "2024-01-01");
        assert_eq!(Date::from_unix_days(19_723 + 59).to_string(), "2024-02-29");
        assert_eq!(Date::from_unix_days(-1).to_string(), "1969-12-31");
        assert!(Date::today_utc() > Date::new(2024, 1, 1).unwrap());
    }

    #[test]
    fn dates_become_days_and_back() {
        for days in [-719_528, -1, 0, 1, 59, 19_723, 19_723 + 59, 20_000, 47_482, 2_932_896] {
            assert_eq!(Date::from_unix_days(days).unix_days(), days, "{days}");
        }
        assert_eq!(Date::MIN.to_string(), "0000-01-01");
        assert_eq!(Date::MIN.unix_days(), -719_528);
        let d = |s: &str| s.parse::<Date>().unwrap();
        assert_eq!(d("2026-06-01").days_until(d("2026-07-01")), 30);
        assert_eq!(d("2028-02-28").days_until(d("2028-03-01")), 2);
        assert_eq!(d("2026-06-01").days_until(d("2026-05-31")), -1);
        assert_eq!(d("2026-06-01").days_until(d("2026-06-01")), 0);
        assert!(Date::MIN < d("0000-01-02"));
    }

    #[test]
    fn parses_and_orders() {
        let d: Date = "2027-03-31".parse().unwrap();
        assert_eq!(d, Date::new(2027, 3, 31).unwrap());
        assert!(d < Date::new(2027, 4, 1).unwrap());
        for bad in ["2027-02-29", "2027-13-01", "27-03-31", "2027-3-31", "2027-03-31x", ""] {
            assert!(bad.parse::<Date>().is_err(), "{bad}");
        }
        assert!(Date::new(2028, 2, 29).is_some());
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"2027-03-31\"");
        assert_eq!(serde_json::from_str::<Date>("\"2027-03-31\"").unwrap(), d);
    }
}
