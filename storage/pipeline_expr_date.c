/* The date operators of the expression language (issue #20, pipeline_ext.h): $year ...
 * $isoDayOfWeek, $dateToString, $dateToParts, and the ISO-8601 printing and parsing that
 * $toString/$toDate/$convert use, with MongoDB 6.0's rules, codes and messages
 * (expression.cpp, query/datetime/date_time_support.cpp). Calendar arithmetic is the
 * proleptic Gregorian calendar on int64 milliseconds (any date, before 1970 or far
 * future), computed without the C library's time zone or locale: shard replica-set
 * members replicate commands, so every member must compute the same result. Time zones:
 * UTC (and its Olson aliases UTC, GMT, Etc/UTC, Etc/GMT, Z) and fixed offsets "+hh",
 * "+hhmm", "+hh:mm" (and '-'); other Olson names are refused with 238 NotImplemented, as
 * stripedb carries no time zone database. */
#include "storage/pipeline_ext.h"

#define MS_PER_DAY INT64_C(86400000)

static int64_t floor_div(int64_t a, int64_t b)
{
	int64_t q = a / b;

	return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* Days since 1970-01-01 of y-m-d (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d)
{
	int64_t era, yoe, doy, doe;

	y -= m <= 2;
	era = floor_div(y, 400);
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
	int64_t era, doe, yoe, doy, mp;

	z += 719468;
	era = floor_div(z, 146097);
	doe = z - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	*y = yoe + era * 400;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	*d = (int)(doy - (153 * mp + 2) / 5 + 1);
	*m = (int)(mp < 10 ? mp + 3 : mp - 9);
	*y += *m <= 2;
}

static bool leap(int64_t y)
{
	return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* The broken-down fields of a local time. */
typedef struct {
	int64_t year;
	int month, day, hour, minute, second, ms;
	int yday;    /* 1..366 */
	int wday;    /* 0 = Sunday .. 6 */
	int64_t days; /* since the epoch */
} dparts;

static void split_ms(int64_t ms, dparts *p)
{
	/* days * MS_PER_DAY would overflow for the last partial day above INT64_MIN (a
	 * Date(-2^63), Java's Long.MIN_VALUE): the remainder is taken first */
	int64_t days = ms / MS_PER_DAY;
	int64_t rem = ms % MS_PER_DAY;

	if (rem < 0) {
		rem += MS_PER_DAY;
		days--;
	}

	civil_from_days(days, &p->year, &p->month, &p->day);
	p->days = days;
	p->hour = (int)(rem / 3600000);
	p->minute = (int)(rem / 60000 % 60);
	p->second = (int)(rem / 1000 % 60);
	p->ms = (int)(rem % 1000);
	p->yday = (int)(days - days_from_civil(p->year, 1, 1) + 1);
	p->wday = (int)(((days % 7) + 11) % 7); /* 1970-01-01 was a Thursday */
}

/* ISO 8601 week-numbering year and week of p. */
static void iso_week(const dparts *p, int64_t *iy, int *iw)
{
	int isodow = p->wday == 0 ? 7 : p->wday;
	int w = (p->yday - isodow + 10) / 7;

	*iy = p->year;
	if (w < 1) {
		/* the last week of the previous year: 53 when its Dec 31 is a Thursday, or a
		 * Friday of a leap year */
		int64_t py = p->year - 1;
		int dec31 = (int)(((days_from_civil(py, 12, 31) % 7) + 11) % 7);

		*iy = py;
		w = (dec31 == 4 || (dec31 == 5 && leap(py))) ? 53 : 52;
	} else if (w == 53) {
		int dec31 = (int)(((days_from_civil(p->year, 12, 31) % 7) + 11) % 7);

		if (!(dec31 == 4 || (dec31 == 5 && leap(p->year)))) { /* a 52-week year */
			*iy = p->year + 1;
			w = 1;
		}
	}
	*iw = w;
}

void agg_date_iso(int64_t ms, char *buf, size_t len)
{
	dparts p;

	split_ms(ms, &p);
	snprintf(buf, len, "%04lld-%02d-%02dT%02d:%02d:%02d.%03dZ", (long long)p.year, p.month,
		 p.day, p.hour, p.minute, p.second, p.ms);
}

/* ---- parsing ---- */

static bool digits(const char *s, size_t len, size_t at, int n, int *out)
{
	int v = 0;

	if (at + (size_t)n > len) {
		return false;
	}
	for (int i = 0; i < n; i++) {
		if (s[at + i] < '0' || s[at + i] > '9') {
			return false;
		}
		v = v * 10 + (s[at + i] - '0');
	}
	*out = v;
	return true;
}

/* "+hh", "+hhmm", "+hh:mm" (or '-') at s: the offset in minutes, mm at most max_min.
 * Returns: 0, or -1. */
static int parse_offset_max(const char *s, size_t len, int max_min, int *minutes)
{
	int h = 0, m = 0;

	if (len < 3 || (s[0] != '+' && s[0] != '-') || !digits(s, len, 1, 2, &h)) {
		return -1;
	}
	if (len == 3) {
		m = 0;
	} else if (len == 5 && digits(s, len, 3, 2, &m)) {
	} else if (len == 6 && s[3] == ':' && digits(s, len, 4, 2, &m)) {
	} else {
		return -1;
	}
	if (h > 99 || m > max_min) {
		return -1;
	}
	*minutes = (s[0] == '-' ? -1 : 1) * (h * 60 + m);
	return 0;
}

/* An offset inside a date string (minutes 00-59). */
static int parse_offset(const char *s, size_t len, int *minutes)
{
	return parse_offset_max(s, len, 59, minutes);
}

/* agg_date_parse_iso with *zoned telling whether the string carried its own 'Z' or offset
 * (when not, *ms is the local time as if at UTC). */
static int parse_iso(const char *s, size_t len, int64_t *ms, bool *zoned, char *why, size_t whylen)
{
	int y, mo, d, h = 0, mi = 0, sec = 0, frac = 0, off = 0;
	size_t i = 10;

	*zoned = false;

	if (why != NULL && whylen > 0) {
		why[0] = '\0';
	}
	if (!digits(s, len, 0, 4, &y) || len < 10 || s[4] != '-' || !digits(s, len, 5, 2, &mo) ||
	    s[7] != '-' || !digits(s, len, 8, 2, &d)) {
		snprintf(why, whylen, "stripedb parses ISO 8601 dates (YYYY-MM-DD[THH:MM[:SS[.mmm]]][Z|+hh:mm]) without a format");
		return -1;
	}
	if (mo < 1 || mo > 12 || d < 1 ||
	    d > (int)(days_from_civil(mo == 12 ? y + 1 : y, mo == 12 ? 1 : mo + 1, 1) -
		      days_from_civil(y, mo, 1))) {
		snprintf(why, whylen, "The parsed date was invalid");
		return -1;
	}
	if (i < len && (s[i] == 'T' || s[i] == ' ')) {
		if (!digits(s, len, i + 1, 2, &h) || i + 3 >= len || s[i + 3] != ':' ||
		    !digits(s, len, i + 4, 2, &mi)) {
			snprintf(why, whylen, "Unexpected data found after the date");
			return -1;
		}
		i += 6;
		if (i < len && s[i] == ':') {
			if (!digits(s, len, i + 1, 2, &sec)) {
				snprintf(why, whylen, "Unexpected data found after the time");
				return -1;
			}
			i += 3;
			if (i < len && s[i] == '.') {
				int scale = 100, n = 0;

				i++;
				while (i < len && s[i] >= '0' && s[i] <= '9') {
					frac += (s[i] - '0') * scale;
					scale /= 10;
					i++;
					n++;
				}
				if (n == 0) {
					snprintf(why, whylen, "Unexpected data found after the time");
					return -1;
				}
			}
		}
		if (h > 23 || mi > 59 || sec > 59) {
			snprintf(why, whylen, "The parsed time was invalid");
			return -1;
		}
		if (i + 1 < len && s[i] == ' ' && (s[i + 1] == 'Z' || s[i + 1] == '+' || s[i + 1] == '-')) {
			i++;
		}
		if (i < len && s[i] == 'Z' && i + 1 == len) {
			i++;
			*zoned = true;
		} else if (i < len && parse_offset(s + i, len - i, &off) == 0) {
			i = len;
			*zoned = true;
		}
	}
	if (i != len) {
		snprintf(why, whylen, "Trailing data");
		return -1;
	}
	*ms = days_from_civil(y, mo, d) * MS_PER_DAY + (int64_t)h * 3600000 + (int64_t)mi * 60000 +
	      (int64_t)sec * 1000 + frac - (int64_t)off * 60000;
	return 0;
}

int agg_date_parse_iso(const char *s, size_t len, int64_t *ms, char *why, size_t whylen)
{
	bool zoned;

	return parse_iso(s, len, ms, &zoned, why, whylen);
}

/* ---- operands ---- */

/* The time zone at tz (a string) into *offset_min: a UTC name, or an offset "+hh",
 * "+hhmm", "+hh:mm" (or '-') of any two digits each, as mongod's getTimeZone. Errors: 40517
 * not a string, 40485 an unknown identifier (a malformed offset included), 238 an Olson
 * name other than UTC's. */
static int parse_tz(const docbuild_node *tz, int *offset_min, const ectx *e)
{
	static const char *const utc[] = {"UTC", "GMT", "Etc/UTC", "Etc/GMT", "Z", "Etc/Universal",
					  "Universal", "Etc/Zulu", "Zulu", "UCT", "Etc/UCT"};
	const char *s;
	size_t len;

	if (tz->type != BSON_TYPE_UTF8) {
		return efail(e, 40517, "timezone must evaluate to a string, found %s", type_name(tz->type));
	}
	s = tz->value.value.v_utf8.str;
	len = tz->value.value.v_utf8.len;
	for (size_t i = 0; i < sizeof utc / sizeof utc[0]; i++) {
		if (strlen(utc[i]) == len && memcmp(utc[i], s, len) == 0) {
			*offset_min = 0;
			return 0;
		}
	}
	/* mongod 6.0's TimeZoneDatabase::parseUtcOffset: two digits each, not range-checked
	 * ("+24:00" is a day ahead, "+01:99" 2 h 39 min); any other shape is 40485 */
	if (parse_offset_max(s, len, 99, offset_min) == 0) {
		return 0;
	}
	if (len > 0 && ((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z'))) {
		return efail(e, C_NOT_IMPLEMENTED,
			     "time zone '%.*s' is not supported by stripedb: only UTC and fixed offsets "
			     "such as '+05:30' are (stripedb carries no time zone database)",
			     (int)(len > 100 ? 100 : len), s);
	}
	return efail(e, 40485, "unrecognized time zone identifier: \"%.*s\"", (int)(len > 100 ? 100 : len),
		     s);
}

/* Value::coerceToDate: a date, a timestamp (seconds) or an ObjectId (its time). */
static int coerce_date(const docbuild_node *v, int64_t *ms, const ectx *e)
{
	switch (v->type) {
	case BSON_TYPE_DATE_TIME:
		*ms = v->value.value.v_datetime;
		return 0;
	case BSON_TYPE_TIMESTAMP:
		*ms = (int64_t)v->value.value.v_timestamp.timestamp * 1000;
		return 0;
	case BSON_TYPE_OID:
		*ms = (int64_t)bson_oid_get_time_t(&v->value.value.v_oid) * 1000;
		return 0;
	default:
		return efail(e, 16006, "can't convert from BSON type %s to Date", type_name(v->type));
	}
}

/* The local time of ms at offset minutes (saturating: no int64 overflow). */
static int64_t local_ms(int64_t ms, int offset_min)
{
	int64_t r;

	if (__builtin_add_overflow(ms, (int64_t)offset_min * 60000, &r)) {
		return ms < 0 ? INT64_MIN : INT64_MAX;
	}
	return r;
}

/* ---- $dateToString ---- */

/* A growable output string. */
typedef struct {
	char *p;
	size_t len, cap;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->p = sdb_realloc(b->p, b->cap);
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void put_padded(sbuf_t *b, int64_t v, int width)
{
	char tmp[32];

	snprintf(tmp, sizeof tmp, "%0*lld", width, (long long)v);
	sb_add(b, tmp, strlen(tmp));
}

/* The format string's check (checkFormatString). */
static int check_format(const char *f, size_t len, const ectx *e)
{
	for (size_t i = 0; i < len; i++) {
		if (f[i] != '%') {
			continue;
		}
		if (i + 1 == len) {
			return efail(e, 18535, "Unmatched '%%' at end of format string");
		}
		i++;
		if (strchr("dGHjLmMSuUVwYzZ%", f[i]) == NULL || f[i] == '\0') {
			return efail(e, 18536, "Invalid format character '%%%c' in format string", f[i]);
		}
	}
	return 0;
}

static int format_date(const char *f, size_t len, int64_t utc_ms, int off, sbuf_t *b, const ectx *e)
{
	dparts p;
	int64_t iy;
	int iw;

	split_ms(local_ms(utc_ms, off), &p);
	iso_week(&p, &iy, &iw);
	for (size_t i = 0; i < len; i++) {
		int64_t v = 0;
		int w = 2;

		if (f[i] != '%') {
			sb_add(b, f + i, 1);
			continue;
		}
		i++;
		switch (f[i]) {
		case '%':
			sb_add(b, "%", 1);
			continue;
		case 'Y': v = p.year; w = 4; break;
		case 'G': v = iy; w = 4; break;
		case 'm': v = p.month; break;
		case 'd': v = p.day; break;
		case 'H': v = p.hour; break;
		case 'M': v = p.minute; break;
		case 'S': v = p.second; break;
		case 'L': v = p.ms; w = 3; break;
		case 'j': v = p.yday; w = 3; break;
		case 'w': v = p.wday + 1; w = 1; break;
		case 'u': v = p.wday == 0 ? 7 : p.wday; w = 1; break;
		case 'U': v = (p.yday - 1 + 7 - p.wday) / 7; break;
		case 'V': v = iw; break;
		case 'z': {
			int a = off < 0 ? -off : off;

			sb_add(b, off < 0 ? "-" : "+", 1);
			put_padded(b, a / 60, 2);
			put_padded(b, a % 60, 2);
			continue;
		}
		case 'Z':
			if (off < 0) {
				sb_add(b, "-", 1);
			}
			/* unpadded minutes (date_time_support.h outputDateWithFormat: "%Z" is
			 * durationCount<Minutes>(utcOffset)): 0, 330, -60 */
			put_padded(b, off < 0 ? -off : off, 1);
			continue;
		default:
			break;
		}
		if (v < 0 || v > 9999) {
			return efail(e, 18537,
				     "Could not convert date to string: date component was outside the supported range of 0-9999: %lld",
				     (long long)v);
		}
		put_padded(b, v, w);
	}
	return 0;
}

/* ---- $dateFromParts, $dateFromString, $dateAdd/$dateSubtract, $dateDiff, $dateTrunc ---- */

typedef enum { U_YEAR, U_QUARTER, U_MONTH, U_WEEK, U_DAY, U_HOUR, U_MINUTE, U_SECOND, U_MS } tunit;

static const int64_t unit_ms[U_MS + 1] = {0, 0, 0, 7 * MS_PER_DAY, MS_PER_DAY, 3600000, 60000, 1000, 1};

/* Value::integral64Bit + coerceToLong: a number holding an integer in int64's range. */
static bool as_long(const docbuild_node *v, int64_t *out)
{
	switch (ntype(v)) {
	case BSON_TYPE_INT32:
		*out = v->value.value.v_int32;
		return true;
	case BSON_TYPE_INT64:
		*out = v->value.value.v_int64;
		return true;
	case BSON_TYPE_DOUBLE: {
		double d = v->value.value.v_double;

		if (!(d == floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
			return false;
		}
		*out = (int64_t)d;
		return true;
	}
	case BSON_TYPE_DECIMAL128: {
		bson_decimal128_t d = v->value.value.v_decimal128;

		return sdb_dec_to_int64_trunc(d, out) && sdb_dec_equal(d, sdb_dec_from_int64(*out));
	}
	default:
		return false;
	}
}

static int parse_unit(const docbuild_node *v, const char *name, tunit *u, const ectx *e)
{
	static const char *const names[] = {"year", "quarter", "month", "week", "day",
					    "hour", "minute", "second", "millisecond"};

	if (v->type != BSON_TYPE_UTF8) {
		return efail(e, 5439013, "%s requires 'unit' to be a string, but got %s", name,
			     type_name(v->type));
	}
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		if (strlen(names[i]) == v->value.value.v_utf8.len &&
		    memcmp(names[i], v->value.value.v_utf8.str, v->value.value.v_utf8.len) == 0) {
			*u = (tunit)i;
			return 0;
		}
	}
	return efail(e, C_FAILED_TO_PARSE, "unknown time unit value: %.*s",
		     (int)(v->value.value.v_utf8.len > 100 ? 100 : v->value.value.v_utf8.len),
		     v->value.value.v_utf8.str);
}

/* startOfWeek: a day name or its three-letter abbreviation, any case; *w 0 = Sunday. */
static int parse_sow(const docbuild_node *v, const char *name, int *w, const ectx *e)
{
	static const char *const days[] = {"sunday",   "monday", "tuesday", "wednesday",
					   "thursday", "friday", "saturday"};
	char low[16];
	size_t len;

	if (v->type != BSON_TYPE_UTF8) {
		return efail(e, 5439015, "%s requires 'startOfWeek' to be a string, but got %s", name,
			     type_name(v->type));
	}
	len = v->value.value.v_utf8.len;
	if (len < sizeof low) {
		for (size_t i = 0; i < len; i++) {
			char c = v->value.value.v_utf8.str[i];

			low[i] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
		}
		low[len] = '\0';
		for (int i = 0; i < 7; i++) {
			if (strcmp(days[i], low) == 0 || (len == 3 && strncmp(days[i], low, 3) == 0)) {
				*w = i;
				return 0;
			}
		}
	}
	return efail(e, 5439016, "%s parameter 'startOfWeek' value cannot be recognized as a day of a week: %.*s",
		     name, (int)(len > 100 ? 100 : len), v->value.value.v_utf8.str);
}

static int days_in_month(int64_t y, int m)
{
	static const int dm[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

	return m == 2 && leap(y) ? 29 : dm[m - 1];
}

/* Local y-m-d + time of day (ms) at offset off to UTC milliseconds. Returns: false on
 * int64 overflow (or a year too far out to compute). */
static bool from_local(int64_t y, int m, int64_t day_add, int64_t tod, int off, int64_t *out)
{
	int64_t days, r;

	if (y > INT64_C(300000000) || y < -INT64_C(300000000)) {
		return false;
	}
	days = days_from_civil(y, m, 1);
	if (__builtin_add_overflow(days, day_add, &days) ||
	    __builtin_mul_overflow(days, MS_PER_DAY, &r) || __builtin_add_overflow(r, tod, &r) ||
	    __builtin_sub_overflow(r, (int64_t)off * 60000, &r)) {
		return false;
	}
	*out = r;
	return true;
}

/* $dateAdd of amount units to ms at offset off (DateAddTimeUnit: a month past the end
 * of the target month lands on its last day). */
static bool date_add(int64_t ms, tunit u, int64_t amount, int off, int64_t *out)
{
	int64_t months, r;
	dparts p;

	if (u >= U_WEEK) {
		/* u is a tunit, at most U_MS: unit_ms's last index (cppcheck takes the enum
		 * for any int) */
		/* cppcheck-suppress arrayIndexOutOfBoundsCond */
		return !__builtin_mul_overflow(amount, unit_ms[u], &r) &&
		       !__builtin_add_overflow(ms, r, out);
	}
	if (__builtin_mul_overflow(amount, u == U_YEAR ? 12 : u == U_QUARTER ? 3 : 1, &months) ||
	    months > INT64_C(3600000000) || months < -INT64_C(3600000000)) {
		return false;
	}
	split_ms(local_ms(ms, off), &p);
	{
		int64_t total = p.year * 12 + (p.month - 1) + months;
		int64_t ny = floor_div(total, 12);
		int nm = (int)(total - ny * 12) + 1;
		int nd = p.day > days_in_month(ny, nm) ? days_in_month(ny, nm) : p.day;
		int64_t tod = ((int64_t)p.hour * 3600 + p.minute * 60 + p.second) * 1000 + p.ms;

		return from_local(ny, nm, nd - 1, tod, off, out);
	}
}

/* The coerced date of an argument for $dateAdd/$dateDiff/$dateTrunc. */
static int arg_date(const docbuild_node *v, int64_t *ms, int code, const char *fmt,
		    const char *name, const ectx *e)
{
	if (coerce_date(v, ms, e) != 0) {
		return efail(e, code, fmt, name, type_name(v->type));
	}
	return 0;
}

static int eval_date_arith(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	const char *name = ext_name(x);
	int64_t ms, amount, r;
	tunit u;
	int off = 0, rc;

	/* args: startDate, unit, amount, timezone */
	for (int i = 0; i < 4; i++) {
		if ((i < 3 || !ext_absent(x->args[3])) && is_nullish(v[i])) {
			*out = v_null();
			return 0;
		}
	}
	if (coerce_date(v[0], &ms, e) != 0) {
		return efail(e, 5166403, "%s requires startDate to be convertible to a date", name);
	}
	if ((rc = parse_unit(v[1], name, &u, e)) != 0) {
		return rc;
	}
	if (!as_long(v[2], &amount)) {
		return efail(e, 5166405, "%s expects integer amount of time units", name);
	}
	if (!ext_absent(x->args[3]) && (rc = parse_tz(v[3], &off, e)) != 0) {
		return rc;
	}
	if (x->ext == E_DATESUBTRACT) {
		if (amount == INT64_MIN) {
			return efail(e, 5166406, "dateSubtract overflowed");
		}
		amount = -amount;
	}
	if (!date_add(ms, u, amount, off, &r)) {
		return efail(e, 5166406, "%s overflowed", x->ext == E_DATEADD ? "dateAdd" : "dateSubtract");
	}
	*out = v_date(r);
	return 0;
}

static int eval_date_diff(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	const char *name = "$dateDiff";
	int64_t a, b, r = 0;
	tunit u;
	int off = 0, sow = 0, rc;
	dparts pa, pb;

	/* args: startDate, endDate, unit, timezone, startOfWeek */
	for (int i = 0; i < 5; i++) {
		if ((i < 3 || !ext_absent(x->args[i])) && is_nullish(v[i])) {
			*out = v_null();
			return 0;
		}
	}
	if ((rc = arg_date(v[0], &a, 5166307, "%s requires 'startDate' to be a date, but got %s", name, e)) != 0 ||
	    (rc = arg_date(v[1], &b, 5166307, "%s requires 'endDate' to be a date, but got %s", name, e)) != 0 ||
	    (rc = parse_unit(v[2], name, &u, e)) != 0) {
		return rc;
	}
	if (!ext_absent(x->args[3]) && (rc = parse_tz(v[3], &off, e)) != 0) {
		return rc;
	}
	if (u == U_WEEK && !ext_absent(x->args[4]) && (rc = parse_sow(v[4], name, &sow, e)) != 0) {
		return rc;
	}
	a = local_ms(a, off);
	b = local_ms(b, off);
	switch (u) {
	case U_MS:
		if (__builtin_sub_overflow(b, a, &r)) {
			return efail(e, 5166308, "dateDiff overflowed");
		}
		break;
	case U_SECOND:
	case U_MINUTE:
	case U_HOUR:
	case U_DAY:
		r = floor_div(b, unit_ms[u]) - floor_div(a, unit_ms[u]);
		break;
	case U_WEEK:
		/* 1970-01-01 was a Thursday (4) */
		r = floor_div(floor_div(b, MS_PER_DAY) + 4 - sow, 7) -
		    floor_div(floor_div(a, MS_PER_DAY) + 4 - sow, 7);
		break;
	default:
		split_ms(a, &pa);
		split_ms(b, &pb);
		if (u == U_YEAR) {
			r = pb.year - pa.year;
		} else if (u == U_QUARTER) {
			r = (pb.year * 4 + (pb.month - 1) / 3) - (pa.year * 4 + (pa.month - 1) / 3);
		} else {
			r = (pb.year * 12 + pb.month) - (pa.year * 12 + pa.month);
		}
		break;
	}
	*out = v_int64(r);
	return 0;
}

static int eval_date_trunc(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	const char *name = "$dateTrunc";
	int64_t ms, bin = 1, local, r;
	tunit u;
	int off = 0, sow = 0, rc;
	char show[128];

	/* args: date, unit, binSize, timezone, startOfWeek */
	for (int i = 0; i < 4; i++) {
		if ((i < 2 || !ext_absent(x->args[i])) && is_nullish(v[i])) {
			*out = v_null();
			return 0;
		}
	}
	if ((rc = arg_date(v[0], &ms, 5439012, "%s requires 'date' to be a date, but got %s", name, e)) != 0 ||
	    (rc = parse_unit(v[1], name, &u, e)) != 0) {
		return rc;
	}
	if (!ext_absent(x->args[2])) {
		if (!as_long(v[2], &bin)) {
			return efail(e, 5439017, "%s requires 'binSize' to be a 64-bit integer, but got value '%s' of type %s",
				     name, ext_show(v[2], show, sizeof show), type_name(v[2]->type));
		}
		if (bin <= 0) {
			return efail(e, 5439018, "%s requires 'binSize' to be greater than 0, but got value %lld",
				     name, (long long)bin);
		}
	}
	if (!ext_absent(x->args[3]) && (rc = parse_tz(v[3], &off, e)) != 0) {
		return rc;
	}
	if (u == U_WEEK && !ext_absent(x->args[4])) {
		if (is_nullish(v[4])) {
			*out = v_null();
			return 0;
		}
		if ((rc = parse_sow(v[4], name, &sow, e)) != 0) {
			return rc;
		}
	}
	local = local_ms(ms, off);
	if (u >= U_WEEK) {
		/* bins from 2000-01-01T00:00 local (weeks: the first startOfWeek day of 2000,
		 * 2000-01-01 being a Saturday) */
		int64_t ref = days_from_civil(2000, 1, 1) * MS_PER_DAY, size;

		if (u == U_WEEK) {
			ref += (int64_t)((sow - 6 + 7) % 7) * MS_PER_DAY;
		}
		if (__builtin_mul_overflow(bin, unit_ms[u], &size)) {
			size = INT64_MAX; /* one bin holds every date */
		}
		{
			/* floor((local - ref) / size) without overflowing: local - ref fits in
			 * int128 */
			__int128 d = (__int128)local - ref;
			__int128 q = d / size;
			__int128 t;

			if (d % size != 0 && d < 0) {
				q--;
			}
			t = q * size + ref - (__int128)off * 60000;
			if (t < INT64_MIN || t > INT64_MAX) {
				return efail(e, 5439000, "dateTrunc overflowed");
			}
			r = (int64_t)t;
		}
	} else {
		dparts p;
		int64_t per = u == U_YEAR ? 12 : u == U_QUARTER ? 3 : 1, size, mi, b;

		split_ms(local, &p);
		mi = (p.year - 2000) * 12 + (p.month - 1);
		if (__builtin_mul_overflow(bin, per, &size)) {
			size = INT64_MAX;
		}
		b = floor_div(mi, size) * size;
		if (!from_local(2000 + floor_div(b, 12), (int)(b - floor_div(b, 12) * 12) + 1, 0, 0, off, &r)) {
			return efail(e, 5439000, "dateTrunc overflowed");
		}
	}
	*out = v_date(r);
	return 0;
}

/* evaluateNumberWithDefault(AndBounds) of $dateFromParts: an integral number, bounded
 * parts in [-32768, 32767]. Returns: 1 when nullish (the result is null), 0, or an error. */
static int part_value(const expr *x, docbuild_node **v, int slot, const char *key, int64_t dflt,
		      bool bounded, int64_t *out, const ectx *e)
{
	char show[128];

	if (ext_absent(x->args[slot])) {
		*out = dflt;
		return 0;
	}
	if (is_nullish(v[slot])) {
		return 1;
	}
	if (!as_long(v[slot], out)) {
		return efail(e, 40515, "'%s' must evaluate to an integer, found %s with value %s", key,
			     type_name(v[slot]->type), ext_show(v[slot], show, sizeof show));
	}
	if (bounded && (*out < -32768 || *out > 32767)) {
		return efail(e, 31034, "'%s' must evaluate to a value in the range [-32768, 32767]; found %lld",
			     key, (long long)*out);
	}
	return 0;
}

static int eval_date_from_parts(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	static const char *const keys[] = {"year", "month", "day", "hour", "minute", "second",
					   "millisecond", "isoWeekYear", "isoWeek", "isoDayOfWeek"};
	static const int64_t dflt[] = {1970, 1, 1, 0, 0, 0, 0, 1970, 1, 1};
	static const bool bounded[] = {false, true, true, true, true, false, false, false, true, true};
	int64_t p[10], tod, r, days;
	int off = 0, rc;
	bool iso = ext_absent(x->args[0]);

	for (int i = 0; i < 10; i++) {
		if ((iso && i <= 2) || (!iso && i >= 7)) {
			p[i] = 0;
			continue;
		}
		rc = part_value(x, v, i, keys[i], dflt[i], bounded[i], &p[i], e);
		if (rc == 1) {
			*out = v_null();
			return 0;
		}
		if (rc != 0) {
			return rc;
		}
	}
	if (!ext_absent(x->args[10])) {
		if (is_nullish(v[10])) {
			*out = v_null();
			return 0;
		}
		if ((rc = parse_tz(v[10], &off, e)) != 0) {
			return rc;
		}
	}
	if (!iso && (p[0] < 1 || p[0] > 9999)) {
		return efail(e, 40523, "'year' must evaluate to an integer in the range 1 to 9999, found %lld",
			     (long long)p[0]);
	}
	if (iso && (p[7] < 1 || p[7] > 9999)) {
		return efail(e, 31095, "'isoWeekYear' must evaluate to an integer in the range 1 to 9999, found %lld",
			     (long long)p[7]);
	}
	/* seconds and milliseconds are unbounded longs: the time of day in int128 */
	{
		__int128 t = (__int128)p[3] * 3600000 + (__int128)p[4] * 60000 + (__int128)p[5] * 1000 + p[6];

		if (t < -(__int128)INT64_C(4000000000000000000) || t > (__int128)INT64_C(4000000000000000000)) {
			return efail(e, C_BAD_VALUE, "$dateFromParts: the date is out of range");
		}
		tod = (int64_t)t;
	}
	if (!iso) {
		int64_t total = p[0] * 12 + (p[1] - 1);
		int64_t y = floor_div(total, 12);

		if (!from_local(y, (int)(total - y * 12) + 1, p[2] - 1, tod, off, &r)) {
			return efail(e, C_BAD_VALUE, "$dateFromParts: the date is out of range");
		}
	} else {
		/* the Monday of ISO week 1 (the week holding January 4th) */
		int64_t jan4 = days_from_civil(p[7], 1, 4);
		int wd = (int)(((jan4 % 7) + 11) % 7); /* 0 = Sunday */
		int64_t monday = jan4 - (wd == 0 ? 6 : wd - 1);

		days = monday + (p[8] - 1) * 7 + (p[9] - 1);
		if (!from_local(1970, 1, days, tod, off, &r)) {
			return efail(e, C_BAD_VALUE, "$dateFromParts: the date is out of range");
		}
	}
	*out = v_date(r);
	return 0;
}

/* $dateFromString with a format: %Y %m %d %H %M %S %L %z %Z %% and literal characters;
 * other specifiers are refused (241). */
static int parse_with_format(const char *s, size_t len, const char *f, size_t flen, int64_t *ms,
			     bool *zoned, char *why, size_t whylen)
{
	int64_t y = 1970;
	int mo = 1, d = 1, h = 0, mi = 0, sec = 0, msec = 0, off = 0;
	size_t i = 0;

	*zoned = false;
	for (size_t k = 0; k < flen; k++) {
		int n = 0, val = 0, *dst = NULL, width = 2;

		if (f[k] != '%') {
			if (i >= len || s[i] != f[k]) {
				snprintf(why, whylen, "Error parsing date string: the string does not match the format");
				return -1;
			}
			i++;
			continue;
		}
		k++;
		switch (f[k]) {
		case '%':
			if (i >= len || s[i] != '%') {
				snprintf(why, whylen, "Error parsing date string: the string does not match the format");
				return -1;
			}
			i++;
			continue;
		case 'Y': width = 4; break;
		case 'm': dst = &mo; break;
		case 'd': dst = &d; break;
		case 'H': dst = &h; break;
		case 'M': dst = &mi; break;
		case 'S': dst = &sec; break;
		case 'L': dst = &msec; width = 3; break;
		case 'z':
		case 'Z': {
			size_t st = i;

			if (f[k] == 'z') {
				while (i < len && (s[i] == '+' || s[i] == '-' || s[i] == ':' ||
						   (s[i] >= '0' && s[i] <= '9'))) {
					i++;
				}
				if (parse_offset(s + st, i - st, &off) != 0) {
					snprintf(why, whylen, "Error parsing date string: invalid time zone offset");
					return -1;
				}
			} else {
				int sign = 1;

				if (i < len && (s[i] == '+' || s[i] == '-')) {
					sign = s[i] == '-' ? -1 : 1;
					i++;
				}
				while (i < len && s[i] >= '0' && s[i] <= '9' && n < 4) {
					val = val * 10 + (s[i++] - '0');
					n++;
				}
				if (n == 0) {
					snprintf(why, whylen, "Error parsing date string: invalid time zone offset");
					return -1;
				}
				off = sign * val;
			}
			*zoned = true;
			continue;
		}
		default:
			snprintf(why, whylen, "the format specifier %%%c is not supported by stripedb's $dateFromString",
				 f[k]);
			return -1;
		}
		while (i < len && s[i] >= '0' && s[i] <= '9' && n < width) {
			val = val * 10 + (s[i++] - '0');
			n++;
		}
		if (n == 0) {
			snprintf(why, whylen, "Error parsing date string: a number was expected");
			return -1;
		}
		if (dst == NULL) {
			y = val;
		} else {
			*dst = f[k] == 'L' ? (n == 1 ? val * 100 : n == 2 ? val * 10 : val) : val;
		}
	}
	if (i != len) {
		snprintf(why, whylen, "Trailing data");
		return -1;
	}
	if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 59) {
		snprintf(why, whylen, "The parsed date was invalid");
		return -1;
	}
	*ms = days_from_civil(y, mo, d) * MS_PER_DAY + (int64_t)h * 3600000 + (int64_t)mi * 60000 +
	      (int64_t)sec * 1000 + msec - (int64_t)off * 60000;
	return 0;
}

static int eval_date_from_string(const expr *x, const bson_t *root, docbuild_node **v,
				 docbuild_node **out, const ectx *e)
{
	/* args: dateString, format, timezone, onError, onNull */
	int off = 0, rc;
	bool have_tz = !ext_absent(x->args[2]), zoned = false;
	char why[200], show[200];
	int64_t ms;
	const char *s;
	size_t len;

	if (!ext_absent(x->args[1])) {
		if (!is_nullish(v[1]) && v[1]->type != BSON_TYPE_UTF8) {
			return efail(e, 40684, "$dateFromString requires that 'format' be a string, found: %s with value %s",
				     type_name(v[1]->type), ext_show(v[1], show, sizeof show));
		}
		if (!is_nullish(v[1])) {
			rc = check_format(v[1]->value.value.v_utf8.str, v[1]->value.value.v_utf8.len, e);
			if (rc != 0) {
				return rc;
			}
		}
	}
	if (is_nullish(v[0])) {
		if (!ext_absent(x->args[4])) {
			return ext_arg(x, 4, root, out, e);
		}
		*out = v_null();
		return 0;
	}
	if ((!ext_absent(x->args[1]) && is_nullish(v[1])) || (have_tz && is_nullish(v[2]))) {
		*out = v_null();
		return 0;
	}
	if (have_tz && (rc = parse_tz(v[2], &off, e)) != 0) {
		return rc;
	}
	if (v[0]->type != BSON_TYPE_UTF8) {
		rc = efail(e, C_CONVERSION_FAILURE, "$dateFromString requires that 'dateString' be a string, found: %s with value %s",
			   type_name(v[0]->type), ext_show(v[0], show, sizeof show));
		goto failed;
	}
	s = v[0]->value.value.v_utf8.str;
	len = v[0]->value.value.v_utf8.len;
	why[0] = '\0';
	rc = ext_absent(x->args[1])
		     ? parse_iso(s, len, &ms, &zoned, why, sizeof why)
		     : parse_with_format(s, len, v[1]->value.value.v_utf8.str,
					 v[1]->value.value.v_utf8.len, &ms, &zoned, why, sizeof why);
	if (rc != 0) {
		rc = efail(e, C_CONVERSION_FAILURE, "Error parsing date string '%.*s'; %s",
			   (int)(len > 200 ? 200 : len), s, why);
		goto failed;
	}
	if (zoned && have_tz) {
		rc = efail(e, C_CONVERSION_FAILURE,
			   "you cannot pass in a date/time string with time zone information ('%.*s') together with a second time zone argument",
			   (int)(len > 200 ? 200 : len), s);
		goto failed;
	}
	if (!zoned && __builtin_sub_overflow(ms, (int64_t)off * 60000, &ms)) {
		rc = efail(e, C_CONVERSION_FAILURE, "Error parsing date string '%.*s'; out of range",
			   (int)(len > 200 ? 200 : len), s);
		goto failed;
	}
	*out = v_date(ms);
	return 0;
failed:
	if (!ext_absent(x->args[3])) {
		if (e->code != NULL) {
			*e->code = 0;
		}
		return ext_arg(x, 3, root, out, e);
	}
	return rc;
}

/* ---- dispatch ---- */

static int eval_part(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	int64_t ms, iy;
	int off = 0, iw, rc;
	dparts p;

	if (is_nullish(v[0]) || (!ext_absent(x->args[1]) && is_nullish(v[1]))) {
		*out = v_null();
		return 0;
	}
	if (!ext_absent(x->args[1]) && (rc = parse_tz(v[1], &off, e)) != 0) {
		return rc;
	}
	if ((rc = coerce_date(v[0], &ms, e)) != 0) {
		return rc;
	}
	split_ms(local_ms(ms, off), &p);
	switch (x->ext) {
	case E_YEAR:
		*out = v_int32((int32_t)p.year);
		break;
	case E_MONTH: *out = v_int32(p.month); break;
	case E_DAYOFMONTH: *out = v_int32(p.day); break;
	case E_DAYOFWEEK: *out = v_int32(p.wday + 1); break;
	case E_DAYOFYEAR: *out = v_int32(p.yday); break;
	case E_HOUR: *out = v_int32(p.hour); break;
	case E_MINUTE: *out = v_int32(p.minute); break;
	case E_SECOND: *out = v_int32(p.second); break;
	case E_MILLISECOND: *out = v_int32(p.ms); break;
	case E_WEEK: *out = v_int32((p.yday - 1 + 7 - p.wday) / 7); break;
	case E_ISODAYOFWEEK: *out = v_int32(p.wday == 0 ? 7 : p.wday); break;
	default:
		iso_week(&p, &iy, &iw);
		*out = x->ext == E_ISOWEEK ? v_int32(iw) : v_int32((int32_t)iy);
		break;
	}
	return 0;
}

static void put_field(docbuild_node *d, const char *k, int64_t v)
{
	docbuild_node *n = v_int32((int32_t)v);

	docbuild_set_key(n, k);
	docbuild_push(d, n);
}

int agg_date_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node *v[12] = {NULL};
	int rc = 0, off = 0;
	int64_t ms;

	*out = NULL;
	for (size_t i = 0; i < x->n && i < 12 && rc == 0; i++) {
		/* onNull / onError are evaluated only when needed */
		if ((x->ext == E_DATETOSTRING && i == 3) || (x->ext == E_DATEFROMSTRING && i == 3)) {
			break;
		}
		rc = ext_arg(x, i, root, &v[i], e);
	}
	if (rc != 0) {
		goto done;
	}
	switch (x->ext) {
	case E_DATETOSTRING: {
		/* args: date, format, timezone, onNull */
		const char *f = "%Y-%m-%dT%H:%M:%S.%LZ";
		size_t flen = strlen(f);
		sbuf_t b = {0};

		if (!ext_absent(x->args[1])) {
			if (is_nullish(v[1])) {
				*out = v_null();
				break;
			}
			if (v[1]->type != BSON_TYPE_UTF8) {
				char show[200];

				rc = efail(e, 18533, "$dateToString requires that 'format' be a string, found: %s with value %s",
					   type_name(v[1]->type), ext_show(v[1], show, sizeof show));
				break;
			}
			f = v[1]->value.value.v_utf8.str;
			flen = v[1]->value.value.v_utf8.len;
			if ((rc = check_format(f, flen, e)) != 0) {
				break;
			}
		}
		if (!ext_absent(x->args[2])) {
			if (is_nullish(v[2])) {
				*out = v_null();
				break;
			}
			if ((rc = parse_tz(v[2], &off, e)) != 0) {
				break;
			}
			if (ext_absent(x->args[1]) && off != 0) {
				f = "%Y-%m-%dT%H:%M:%S.%L";
				flen = strlen(f);
			}
		}
		if (is_nullish(v[0])) {
			if (!ext_absent(x->args[3])) {
				rc = ext_arg(x, 3, root, out, e);
			} else {
				*out = v_null();
			}
			break;
		}
		if ((rc = coerce_date(v[0], &ms, e)) != 0) {
			break;
		}
		rc = format_date(f, flen, ms, off, &b, e);
		if (rc == 0) {
			*out = v_string(b.p != NULL ? b.p : "", b.len);
		}
		free(b.p);
		break;
	}
	case E_DATETOPARTS: {
		/* args: date, timezone, iso8601 */
		bool iso = false;
		dparts p;
		docbuild_node *d;

		if (!ext_absent(x->args[2]) && !is_nullish(v[2])) {
			if (v[2]->type != BSON_TYPE_BOOL) {
				rc = efail(e, 40521, "iso8601 must evaluate to a bool, found %s",
					   type_name(v[2]->type));
				break;
			}
			iso = v[2]->value.value.v_bool;
		}
		if (is_nullish(v[0]) || (!ext_absent(x->args[1]) && is_nullish(v[1])) ||
		    (!ext_absent(x->args[2]) && is_nullish(v[2]))) {
			*out = v_null();
			break;
		}
		if (!ext_absent(x->args[1]) && (rc = parse_tz(v[1], &off, e)) != 0) {
			break;
		}
		if ((rc = coerce_date(v[0], &ms, e)) != 0) {
			break;
		}
		split_ms(local_ms(ms, off), &p);
		d = docbuild_new_doc(NULL);
		if (iso) {
			int64_t iy;
			int iw;

			iso_week(&p, &iy, &iw);
			put_field(d, "isoWeekYear", iy);
			put_field(d, "isoWeek", iw);
			put_field(d, "isoDayOfWeek", p.wday == 0 ? 7 : p.wday);
		} else {
			put_field(d, "year", p.year);
			put_field(d, "month", p.month);
			put_field(d, "day", p.day);
		}
		put_field(d, "hour", p.hour);
		put_field(d, "minute", p.minute);
		put_field(d, "second", p.second);
		put_field(d, "millisecond", p.ms);
		*out = d;
		break;
	}
	case E_DATEFROMPARTS:
		rc = eval_date_from_parts(x, v, out, e);
		break;
	case E_DATEFROMSTRING:
		rc = eval_date_from_string(x, root, v, out, e);
		break;
	case E_DATEADD:
	case E_DATESUBTRACT:
		rc = eval_date_arith(x, v, out, e);
		break;
	case E_DATEDIFF:
		rc = eval_date_diff(x, v, out, e);
		break;
	case E_DATETRUNC:
		rc = eval_date_trunc(x, v, out, e);
		break;
	default:
		rc = eval_part(x, v, out, e);
		break;
	}
done:
	for (size_t i = 0; i < 12; i++) {
		docbuild_free(v[i]);
	}
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}
